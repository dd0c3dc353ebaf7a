"""README.md's findings block: what the committed study finds, in REPORT's own sentences.

`findings_markdown(findings)` opens with REPORT's answer (scaling.study.report.prose.answer_section), then
one bullet per finding whose sentence is the one REPORT's section for it opens with, from the same
function on the same findings dict (`bullets`): the corpora, the held-out budget's prediction, the chosen
law, P* at the largest budget, scaling granularity, outliers and the GPU pilot. What is README's alone is
the layout: the generated-block note, each bullet's bold label and the GPU pilot's link. `with_findings`
puts the block between README's markers. Both are pure: `paper_figures/make_figures.py` does the reading
and writing, and tests check that README.md holds exactly the block the committed findings.json gives and
that every bullet's sentence is in REPORT.
"""

from __future__ import annotations

from scaling.errors import ConfigError
from scaling.study.report import law_prose, prose

BEGIN = "<!-- findings:begin -->"
END = "<!-- findings:end -->"
GENERATED_NOTE = ("<!-- written by `python paper_figures/make_figures.py` from paper_figures/findings.json; "
                  "edits here are overwritten -->")


def with_findings(readme: str, block: str) -> str:
    """`readme` with the text between its BEGIN and END markers replaced by `block`."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start or readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ConfigError("README.md", f"{readme.count(BEGIN)} {BEGIN!r} and {readme.count(END)} {END!r} markers",
                          f"one {BEGIN} line followed by one {END} line")
    return readme[:start] + BEGIN + "\n" + block.rstrip("\n") + "\n" + readme[end:]


def findings_markdown(f: dict) -> str:
    """The findings block (without the markers) for a findings.json dict: REPORT's answer word for word,
    then one bullet per other finding (`bullets`); REPORT has the detail."""
    lines = [GENERATED_NOTE, prose.runs_sentence(f) + " REPORT.md opens with the same answer and says each line below.",
             "", prose.answer_section(f), ""]
    lines += [_line(b) for b in bullets(f)]
    return "\n".join(lines) + "\n"


def _line(bullet: tuple[str, str, str]) -> str:
    indent, label, sentence = bullet
    return f"{indent}- {label}{sentence}"


def bullets(f: dict) -> list[tuple[str, str, str]]:
    """(indent, label, sentence) per bullet: the label is README's, the sentence REPORT's."""
    unit = f["loss_unit"]
    out = [("", f"**Corpora at C = {prose.fmt(b['budget'])}.** ", prose.corpora_sentence(b["corpora"]))
           for b in f["budgets"] if len(b.get("corpora") or {}) > 1]
    out += _prediction_bullets(f, unit)
    law = law_prose.law_headline(f.get("law"))
    if law:
        out.append(("", "**Which law.** ", law))
    if f.get("P_star"):
        out.append(("", "**P\\*.** ", law_prose.pstar_headline(f["P_star"][-1])))
    elif "P_star" in f:
        out.append(("", "**P\\*.** ", law_prose.pstar_section(f)))
    if f.get("granularity"):
        out.append(("", "**Scaling granularity.** ", prose.granularity_headline(f["granularity"], unit)))
    if f.get("outliers"):
        out.append(("", "**Outliers.** ", prose.outliers_headline(f["outliers"], unit)))
    return out + _gpu_pilot(f.get("gpu_pilot"), unit)


def _prediction(f: dict, unit: str) -> list[str]:
    """The held-out budget's bullet as README shows it ([] without a prediction)."""
    return [_line(b) for b in _prediction_bullets(f, unit)]


def _prediction_bullets(f: dict, unit: str) -> list[tuple[str, str, str]]:
    """The held-out budget: its score's first sentence, as REPORT's prediction section says it."""
    p = f.get("prediction")
    if not p:
        return []
    lower = ", ".join(prose.fmt(b) for b in p["fitted_on"]["budgets"])
    return [("", f"**A budget predicted before it was trained** (C = {prose.fmt(p['budget'])}, from C = {lower} alone): ",
             law_prose.prediction_headline(p, unit))]


# the prediction's summary as REPORT writes it (its headline and what the errors may hold besides the law's)
_scored = law_prose.prediction_summary


def _gpu_pilot(g: dict | None, unit: str) -> list[tuple[str, str, str]]:
    """The GPU pilot beside the CPU study: per budget, the verdict and each recipe's gap to its reference
    as REPORT's GPU pilot section opens that budget."""
    if not g:
        return []
    head = ("", f"**The GPU pilot** ({g['runs']} runs on a GPU, its own corpus, compared only with each other; "
                "[docs/gpu.md](docs/gpu.md)):", "")
    if not g.get("budgets"):
        return [(head[0], head[1] + " ", prose.NO_BUDGETS)]
    return [head] + [("  ", f"C = {prose.fmt(b['budget'])}: ", prose.budget_headline(b, unit)) for b in g["budgets"]]
