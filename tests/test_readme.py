"""README.md is a front door that stays true: its findings block is what the committed findings.json
gives, its Python API snippet runs as written, its test command is the one CI runs; and the docs name
every key and law the code accepts, without run labels or diary entries."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from scaling.errors import ConfigError
from scaling.numerics import precision
import readme
from scaling.study.report import prose, schema
from scaling.study.analysis import laws
from scaling.study.analysis.fit import FitResult
from scaling.study.analysis.pstar import profile as profile_lib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_readme_is_a_front_door_of_at_most_200_lines():
    assert len(_readme().splitlines()) <= 200


def test_readme_findings_block_is_generated_from_the_committed_findings():
    findings = schema.load(ROOT / "paper_figures" / "findings.json").to_json()  # its schema checked
    text = _readme()
    assert readme.with_findings(text, readme.findings_markdown(findings)) == text
    block = text[text.index(readme.BEGIN):text.index(readme.END)]
    assert f"{findings['runs']} runs; seeds per (size, recipe, tokens) cell" in block
    assert f"`{findings['law']['name']}`" in block


def _report_from(findings: dict) -> str:
    """REPORT's text from a findings dict alone, by the functions write_report uses: its findings sections,
    the Fitted law section's first paragraph and the study's GPU pilot section."""
    import reference_study

    from scaling.study.report import writer

    parts = [line for lines in writer.findings_sections(findings).values() for line in lines]
    parts += writer.law_sections_head(findings)
    if findings.get("gpu_pilot"):
        parts.append(reference_study.gpu_pilot_section(findings["gpu_pilot"]))
    return "\n".join(parts)


def test_every_readme_bullet_is_a_sentence_reports_section_says_for_the_same_findings():
    """README and REPORT word each finding once: every bullet after the answer is a bold label (README's)
    and a sentence that REPORT's section for that finding says, from one findings object; and the
    committed README's bullets are in the committed REPORT."""
    findings = schema.load(ROOT / "paper_figures" / "findings.json").to_json()
    report = _report_from(findings)
    bullets = readme.bullets(findings)
    labels = [label for _, label, _ in bullets]
    for name in ("**A budget predicted before it was trained**", "**Which law.**", "**P\\*.**", "**Scaling granularity.**",
                 "**Outliers.**", "**The GPU pilot**"):
        assert any(label.startswith(name) for label in labels), name
    for indent, label, sentence in bullets:
        assert sentence in report, (label, sentence)
    block = readme.findings_markdown(findings)
    assert all(readme._line(b) in block.splitlines() for b in bullets)
    # the sentence is the first of its kind in REPORT, not a paraphrase: the law's opens the Fitted law section,
    # the granularity and outlier sentences open theirs, the P* one opens its budget's lines
    from scaling.study.report import law_prose, prose, writer

    sections = writer.findings_sections(findings)
    assert sections["granularity"][2].startswith(prose.granularity_headline(findings["granularity"], findings["loss_unit"]))
    assert sections["outliers"][2].startswith(prose.outliers_headline(findings["outliers"], findings["loss_unit"]))
    assert writer.law_sections_head(findings)[0] == law_prose.law_headline(findings["law"])
    assert law_prose.pstar_section(findings).startswith(law_prose.pstar_headline(findings["P_star"][0]))
    # the committed files agree with each other too
    committed = (ROOT / "paper_figures" / "REPORT.md").read_text(encoding="utf-8")
    text = _readme()
    for _, _, sentence in bullets:
        assert sentence in committed and sentence in text


def test_findings_block_opens_with_reports_answer_and_states_pstar_as_its_law_allows():
    findings = schema.load(ROOT / "paper_figures" / "findings.json").to_json()  # its schema checked
    text = readme.findings_markdown(findings)
    # REPORT's answer word for word: a cell per chip and budget, the winner where the data tell, else "cannot tell"
    assert prose.answer_section(findings) in text
    prose_words = [w for w in re.sub(r"<!--.*?-->", "", text, flags=re.S).split() if w.strip("|-")]
    assert len(prose_words) < 600  # the front door stays short (table rules and HTML comments aside): REPORT has the rest
    for chip, entry in findings["cost_models"]["chips"].items():
        row = next(line for line in text.splitlines()
                   if line.startswith("| ") and chip in line.split(" | ")[0].lstrip("| ").split(", "))
        for b in entry["budgets"]:
            tied = f"{b['tied'][0]}" + (" \\*" if b["recipes"][0]["notes"] else "") + f" or {b['tied'][1]}" if not b["winner"] else ""
            assert (f"**{b['winner']}**" if b["winner"] else tied) in row
    # a law with a bits axis and a profile over the formats chips run: the lowest-loss format at the largest
    # budget, and the others the law's error cannot tell from it (no P(best) from the law's parameter noise)
    # (the committed study's law under kumar: the chosen law may have no bits axis, and then no profile)
    profile = profile_lib.judge_within_error(profile_lib.precision_profile(
        FitResult.from_json(ROOT / "fits" / "isoflop_kumar.json"), findings["P_star"][-1]["compute"], max_samples=20), 0.031)
    best = min(profile["rows"], key=lambda r: r["loss"])
    close = [r["name"] for r in profile["rows"] if r is not best and r["loss"] - best["loss"] < profile["law_error"] * best["loss"]]
    text = readme.findings_markdown({**findings, "P_star": [{**findings["P_star"][-1], "no_bits_axis": None,
                                                             "profile": profile}]})
    assert (f"its lowest loss is {best['name']}'s ({best['bits_per_element']:.3g} bits per element), and {len(close)} "
            f"other{'s are' if len(close) != 1 else ' is'} within its error ({profile['law_error']:.1%} of the loss)") in text
    assert "P(best)" not in text.split("**P\\*.**")[1].split("\n")[0]
    # a law with a bits axis and no profile: P* with its bootstrap CI
    entry = {**findings["P_star"][-1], "no_bits_axis": None, "P": 5.5, "P_ci": [4.8, 6.6], "interval": [4.8, 6.6],
             "law_interval": [4.8, 6.6], "profile": None}
    text = readme.findings_markdown({**findings, "P_star": [entry]})
    assert "**4.8–6.6 bits** (the law's P* 5.5 bits, bootstrap 95% CI 4.8–6.6" in text
    # a law without one: the measured recipes it chooses among, never an interval of bits
    entry = {**findings["P_star"][-1], "no_bits_axis": "capacity", "interval": [6.25, 8.0],
             "recipes": [{"recipe": "mxfp6", "bits": 6.25}], "measured": [{"recipe": "fp8", "bits": 8.0}]}
    text = readme.findings_markdown({**findings, "P_star": [entry]})
    assert "**mxfp6 (6.25 bits), fp8 (8 bits)**: a choice among measured recipes, not an interval" in text
    assert "6.25–8 bits" not in text


def test_with_findings_replaces_only_between_the_markers_and_needs_both():
    text = f"head\n{readme.BEGIN}\nold\n{readme.END}\ntail\n"
    assert readme.with_findings(text, "new") == f"head\n{readme.BEGIN}\nnew\n{readme.END}\ntail\n"
    with pytest.raises(ConfigError, match="findings:end"):
        readme.with_findings(f"head\n{readme.BEGIN}\nold\n", "new")


def test_readme_python_api_snippet_runs_as_written(monkeypatch):
    snippet = re.search(r"```python\n(.*?)```", _section(_readme(), "Python API"), re.S).group(1)
    assert "from scaling import formats, quant, precision, fit, optimal, plan, results" in snippet
    monkeypatch.chdir(ROOT)  # its paths are relative to the repository, as a user runs it
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
    # a number a line's comment promises is what the line gives
    checked = 0
    for line in snippet.splitlines():
        m = re.match(r"(?P<expr>[^#]+?)\s+#\s*(?P<value>-?\d+\.\d+)\b", line)
        if m:
            decimals = len(m["value"].split(".")[1])
            assert round(eval(m["expr"], namespace), decimals) == float(m["value"]), line
            checked += 1
    assert checked >= 1


@pytest.mark.slow
def test_the_tours_optimal_and_plan_commands_answer_from_a_committed_fit(monkeypatch, capsys):
    """The tour's `scaling optimal` printed only 'no optimum' and `plan --fit` refused every committed fit:
    each tour command on a committed fit runs as written and shows an optimum."""
    import shlex

    from scaling import cli

    monkeypatch.chdir(ROOT)
    tour = _section(_readme(), "A tour")
    lines = [line.split("  #")[0].strip() for line in tour.splitlines()
             if line.startswith(("scaling optimal fits/", "scaling plan --fit fits/"))]
    assert len(lines) == 2
    for line in lines:
        assert cli.main(shlex.split(line)[1:]) == 0, line
        out = capsys.readouterr().out
        assert "optimum" in out and "no optimum" not in out, line


def test_readme_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert f"```bash\n{ci}\n```" in _readme()


def test_precision_doc_names_every_recipe_and_quantspec_key():
    doc = (ROOT / "docs" / "precision.md").read_text(encoding="utf-8")
    keys = set(precision._RECIPE_KEYS) | set(precision._SPEC_KEYS)
    missing = sorted(k for k in keys if f"`{k}`" not in doc)
    assert not missing, f"docs/precision.md does not document {missing}"


def test_precision_doc_preset_table_has_every_preset():
    doc = (ROOT / "docs" / "precision.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([a-z0-9-]+)`(?: / `([a-z0-9-]+)`)? \|", doc, re.M))
    named = {name for row in rows for name in row if name}
    missing = sorted(set(precision.PRESETS) - named)
    assert not missing, f"missing from docs/precision.md's preset table: {missing}"


def test_fitting_doc_law_table_has_every_registered_law():
    doc = (ROOT / "docs" / "fitting.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.M))
    assert set(laws.names()) <= rows, f"missing from docs/fitting.md's law table: {sorted(set(laws.names()) - rows)}"


def test_figures_options_are_documented():
    from scaling import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main(["figures", "--help"])
    options = set(re.findall(r"(--[a-z][a-z-]*)", out.getvalue())) - {"--help"}
    assert options >= {"--results", "--fit", "--out"}
    docs = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "experiments.md", ROOT / "docs" / "fitting.md"))
    missing = sorted(o for o in options if f"`{o}" not in docs)
    assert not missing, f"`scaling figures` options not in docs/experiments.md or docs/fitting.md: {missing}"


# dated run labels such as "2026-11-24 (k)", "(n):", "session (l)": history belongs in git
RUN_LABEL = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2} \([a-z]\)|\(([j-q])\)[,:;]|[Ss]essions? \(?[a-z]\)?[ ,:;)]")


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_docs_carry_no_run_labels(path):
    hits = [f"{path.name}:{i}: {line}" for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if RUN_LABEL.search(line)]
    assert not hits, "\n".join(hits)
