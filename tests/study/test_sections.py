"""A study adds its own REPORT sections from a file of its own, without editing the package; a user's
results get a REPORT with none of the reference study's sections."""

import json
import textwrap
from pathlib import Path

import pytest

from scaling import cli
from scaling.errors import ConfigError
from scaling.study.report import plots, writer as report
from scaling.study.sweeps import results

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "results" / "quick.csv"

OWN_STUDY = textwrap.dedent('''
    from scaling.study import report

    PAIRS = (("mxfp4", "fp8"),)

    def sections(results_path):
        def facts(context):
            return {"runs": int(context.main["run_id"].nunique()), "budgets": len(context.facts["budgets"])}
        return [report.Section("my_arm", facts, "My arm", lambda f: f"{f['my_arm']['runs']} runs, mine.",
                               before="pstar"),
                report.Section("nothing", lambda context: [], "Never written", lambda f: "never")]
''')


@pytest.fixture()
def no_figures(monkeypatch):
    monkeypatch.setattr(plots, "make_figures", lambda *args, **kwargs: [])  # the text is what is tested here


def test_a_users_results_get_no_section_of_the_reference_study(tmp_path, no_figures):
    path = report.write_report(results.load(QUICK), report.load_fit(ROOT / "fits" / "quick.json"), tmp_path)
    text = path.read_text()
    for heading in ("The FP4 arm", "integer arm", "The GPU pilot"):
        assert heading not in text
    facts = json.loads((tmp_path / "findings.json").read_text())
    assert not {"fp4_arm", "integer_arm", "gpu_pilot", "host_shift"} & set(facts)
    assert all(b["pairs"] == [] for b in facts["budgets"])


def test_a_study_adds_its_own_section_and_contrasts_from_a_file(tmp_path, no_figures, capsys):
    own = tmp_path / "my_study.py"
    own.write_text(OWN_STUDY)
    out = tmp_path / "report"
    assert cli.main(["figures", "--results", str(QUICK), "--fit", str(ROOT / "fits" / "quick.json"),
                     "--sections", str(own), "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    assert "## My arm\n\n12 runs, mine.\n" in text and "Never written" not in text
    assert text.index("## My arm") < text.index("## P*:") and text.index("## IsoFLOP profiles") < text.index("## My arm")
    facts = json.loads((out / "findings.json").read_text())
    assert facts["my_arm"] == {"runs": 12, "budgets": len(facts["budgets"])} and facts["nothing"] == []
    assert [(p["a"], p["b"]) for b in facts["budgets"] for p in b["pairs"]] == [("mxfp4", "fp8")] * len(facts["budgets"])


def test_a_sections_file_that_is_not_one_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    assert cli.main(["figures", "--results", str(QUICK), "--sections", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sections(results_path)" in err
    with pytest.raises(ConfigError, match="before"):
        report.write_report(results.load(QUICK), None, tmp_path / "s",
                            sections=[report.Section("x", lambda c: 1, "X", lambda f: "x", before="nowhere")])


def test_the_report_leads_with_the_gaps_at_matched_tokens(tmp_path, no_figures):
    """Numerics before cost: each recipe's gap to the reference at the same (N, D, seed) comes first,
    with its clustered and family-wise intervals, before any IsoFLOP verdict a cost model makes."""
    path = report.write_report(results.load(QUICK), None, tmp_path)
    text = path.read_text()
    assert text.index("## At matched tokens: what the formats do") < text.index("## IsoFLOP profiles under the `bits` cost model")
    facts = json.loads((tmp_path / "findings.json").read_text())
    m = facts["matched"]
    assert m["reference"] == "fp32" and m["clustered_by"] == ["N", "seed"] and m["familywise"]["rule"] == "Bonferroni"
    fp8 = next(r for r in m["recipes"] if r["recipe"] == "fp8")
    lo, hi = fp8["mean_familywise_ci"]
    assert fp8["n"] > fp8["clusters"] >= 2 and lo < fp8["mean_ci"][0] <= fp8["mean"] <= fp8["mean_ci"][1] < hi
    assert f"| fp8 | {fp8['n']} ({fp8['clusters']}) | {fp8['mean']:+.4f} |" in text


def test_every_recipe_is_compared_on_every_chip(tmp_path, no_figures):
    """Cost second: every recipe with a gap model at every budget on `bits` and every chip of the table,
    each recipe's charge per 6ND beside them, and REPORT opening with the answer table."""
    path = report.write_report(results.load(QUICK), None, tmp_path)
    text = path.read_text()
    assert (text.index("## The answer") < text.index("| chip | C = ") < text.index("## IsoFLOP profiles under the `bits` cost model")
            < text.index("## On each chip: every recipe at the tokens its cost buys") < text.index("## What was run"))
    facts = json.loads((tmp_path / "findings.json").read_text())
    chips = facts["cost_models"]["chips"]
    assert set(chips) == {"bits", "h100", "h200", "b200", "b300", "mi300x", "mi355x"}
    for entry in chips.values():
        assert [b["budget_reference"] for b in entry["budgets"]] == [b["budget"] for b in facts["budgets"]]
        for b in entry["budgets"]:
            assert {e["recipe"] for e in b["recipes"]} == {"fp32", "fp8", "mxfp4"} and b["compared"] == 3
    for chip in chips:  # a row per chip, or shared by chips whose answer is the same in every cell
        assert any(line.startswith("| ") and chip in line.split(" | ")[0].lstrip("| ").split(", ") for line in text.splitlines())
    charge = {r["recipe"]: r for r in facts["cost_models"]["charges"]["rows"]}
    assert charge["fp8"]["h100"] == pytest.approx(charge["mxfp4"]["h100"])  # FP4 runs at the FP8 rate on an H100
    assert charge["mxfp4"]["b200"] < charge["fp8"]["b200"] and charge["mxfp4"]["bits"] < charge["fp8"]["bits"]
    assert f"| mxfp4 | {charge['mxfp4']['bits']:.3f} ({charge['mxfp4']['bits_tokens']:.2f}x) |" in text


@pytest.mark.parametrize("source, line, what", [
    ("def sections(results_path):\n    return [\n", 2, "SyntaxError: "),
    ("import math\n\nraise RuntimeError('no data here')\n", 3, "RuntimeError: no data here"),
    ("def sections(results_path):\n    return {}['missing']\n", 2, "KeyError: 'missing'"),
    ("from scaling.study import report\n\ndef sections(results_path):\n"
     "    return [report.Section('mine', lambda context: 1 / 0, 'Mine', lambda f: 'x')]\n", 4,
     "ZeroDivisionError: division by zero"),
    ("from scaling.study import report\n\ndef text(facts):\n    return facts['mine'].upper()\n\n"
     "def sections(results_path):\n    return [report.Section('mine', lambda context: 1, 'Mine', text)]\n", 4,
     "AttributeError: 'int' object has no attribute 'upper'"),
])
def test_an_error_in_a_sections_file_is_one_line_naming_its_file_and_line(tmp_path, no_figures, capsys, source, line, what):
    """A syntax error, an exception at import, in sections(), in a Section's facts or in its text: one line,
    `error: sections: FILE:LINE: Type: message`, exit 2 (was: a traceback)."""
    own = tmp_path / "mine.py"
    own.write_text(source)
    assert cli.main(["figures", "--results", str(QUICK), "--fit", str(ROOT / "fits" / "quick.json"),
                     "--sections", str(own), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: sections: {own}:{line}: {what}"), err
