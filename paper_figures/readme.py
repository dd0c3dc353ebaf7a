"""README.md's findings block: what the committed study finds, written from its findings.json.

`findings_markdown(findings)` opens with REPORT's own answer (scaling.study.report.prose.answer_section:
the verdict per chip and budget and what the formats do at matched tokens, word for word as REPORT says
it), then one bullet each for the held-out budget's prediction, the chosen law, P* at the largest budget,
scaling granularity, outliers and the GPU pilot; `with_findings(readme, block)` puts it between README's
markers. Both are pure: `paper_figures/make_figures.py` does the reading and writing, and a test checks
that README.md holds exactly the block the committed findings.json gives, so no finding in README is
typed. REPORT.md has the tables and figures behind each line.
"""

from __future__ import annotations

from typing import Any, Sequence

from scaling.errors import ConfigError
from scaling.study.analysis.findings import host_shift_between, other_hosts
from scaling.study.analysis import fit
from scaling.study.report import prose

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
    """The findings block (without the markers) for a findings.json dict: REPORT's answer, word for word
    (prose.answer_section), then one short bullet per other finding; REPORT has the detail."""
    unit = f["loss_unit"]
    lines = [GENERATED_NOTE,
             f"{f['runs']} IsoFLOP runs, {_span(f['seeds_per_cell'])} seeds per cell; loss in {unit}; REPORT.md opens "
             "with the same answer.", "", prose.answer_section(f), ""]
    lines += _corpora(f)
    lines += _prediction(f, unit)
    lines += _law(f.get("law") or {})
    lines += _pstar(f)
    if f.get("granularity"):
        lines += _granularity(f["granularity"], unit)
    if f.get("outliers"):
        lines += _outliers(f["outliers"], unit)
    lines += _gpu_pilot(f.get("gpu_pilot"), unit)
    return "\n".join(lines) + "\n"


def _corpora(f: dict) -> list[str]:
    """Where a budget's runs trained on more than one corpus: the recipes wholly off the main one."""
    mixed = [b for b in f["budgets"] if len(b.get("corpora") or {}) > 1]
    if not mixed:
        return []
    names = sorted({c for b in mixed for c in b["corpora"]})
    main = max(names, key=lambda c: sum(sum(b["corpora"].get(c, {}).values()) for b in mixed))
    off: dict[str, set[str]] = {}
    for b in mixed:
        for c, recipes in b["corpora"].items():
            for r in recipes:
                if c != main and not b["corpora"].get(main, {}).get(r):
                    off.setdefault(r, set()).add(c)
    wholly = "; ".join(f"{r} ({', '.join(sorted(cs))})" for r, cs in sorted(off.items()))
    return [f"- **Not one corpus.** These runs trained on {len(names)} corpora ({', '.join(names)}; `pysrc` is what "
            f"the training venv holds, so two venvs or checkout paths give two corpora), most on {main}. "
            + (f"Recipes with no run on {main}: {wholly}. " if wholly else "")
            + "Every verdict below between recipes that trained on different corpora confounds the data with the "
              "precision; REPORT's findings list which recipe trained on which."]


def _verdict(b: dict, unit: str) -> str:
    contenders = sorted((e for e in b["recipes"] if (e.get("p_best") or 0) >= 0.025), key=lambda e: -e["p_best"])
    p_best = ", ".join(f"{e['recipe']} {e['p_best']:.2f}" for e in contenders)
    if b["winner"]:
        w = next(e for e in b["recipes"] if e["recipe"] == b["winner"])
        return (f"**{b['winner']}**, {w['loss']:.3f} {unit} (95% CI {w['ci'][0]:.3f}–{w['ci'][1]:.3f}), "
                f"{b['diff']:.3f} below {b['runner_up']} (95% CI of the difference {b['diff_ci'][0]:.3f}–"
                f"{b['diff_ci'][1]:.3f}); P(best) {p_best}.")
    return f"**cannot tell**: {b['reason'].removeprefix('cannot tell: ')} (P(best) {p_best})."


def _prediction(f: dict, unit: str) -> list[str]:
    """The held-out budget: what was predicted before it trained and, once it is measured, the score
    (REPORT has the post-hoc re-prediction and the backtests)."""
    p = f.get("prediction")
    if not p:
        return []
    lower = ", ".join(_num(b) for b in p["fitted_on"]["budgets"])
    return [_first_sentence(f"- **A budget predicted before it was trained** (C = {_num(p['budget'])}, from C = {lower} "
                            "alone): " + _scored(p, unit))]


def _scored(p: dict, unit: str) -> str:
    s = p.get("score")
    if not s:
        return f"Predicted: {p['reason']}; not measured yet."
    if not s["n"]:
        return f"Predicted: {p['reason']}; none of its recipes was measured at this budget."
    text = (f"{s['inside']} of {s['n']} measured minima inside their {p['level']:.0%} prediction intervals, mean error "
            f"{s['mean_error']:+.3f} {unit} (mean absolute {s['mean_abs_error']:.3f})")
    if s.get("gaps"):
        text += (f"; {s['gaps_inside']} of {len(s['gaps'])} predicted gaps to {s['reference']} inside the measured "
                 f"gap's 95% CI")
    text += f". Predicted: {p['reason']}; measured: {s['measured_reason'] or 'no verdict'}."
    corpora = p.get("corpora") or {}
    if corpora.get("measured") and not corpora.get("fitted"):
        text += " Which corpora the fit's runs trained on is not recorded, so the errors may hold a difference of data."
    elif corpora.get("measured") and corpora["measured"] != corpora["fitted"]:
        text += (f" The fit saw {', '.join(corpora['fitted'])}, this budget trained on {', '.join(corpora['measured'])}: "
                 "the errors hold that difference of data too.")
    elif other_hosts(p):
        text += " The fit's runs and this budget's trained on different kinds of host (REPORT names them): the errors hold that difference too"
        shift = host_shift_between(p)
        text += (f"; {shift['runs']} runs trained on both put it at {shift['mean']:+.3f} {unit} (95% CI "
                 f"{shift['ci'][0]:+.3f} to {shift['ci'][1]:+.3f})." if shift else ".")
    return text


def _gpu_pilot(g: dict | None, unit: str) -> list[str]:
    """The GPU pilot beside the CPU study: its verdict and each recipe's gap to its reference, per budget."""
    if not g:
        return []
    head = (f"- **The GPU pilot** ({g['runs']} runs on a GPU, its own corpus, compared only with each other; "
            "[docs/gpu.md](docs/gpu.md)):")
    if not g.get("budgets"):
        return [head + " no budget has IsoFLOP profiles yet: cannot tell."]
    lines = [head]
    for b in g["budgets"]:
        text = f"  - C = {_num(b['budget'])}: {_first_sentence(_verdict(b, unit)).split(' (P(best)')[0].rstrip('.')}."
        reference = next((e["recipe"] for e in b["recipes"] if e.get("gap") is None and e.get("loss") is not None), None)
        gaps = sorted((e for e in b["recipes"] if e.get("gap") is not None and e.get("gap_ci")), key=lambda e: e["gap"])
        if reference and gaps:
            text += (f" Minimum minus {reference}'s (95% CI): "
                     + "; ".join(_gap(e["recipe"], e["gap"], e["gap_ci"], e.get("inside", True)) for e in gaps) + ".")
        lines.append(text)
    return lines


def _law(law: dict) -> list[str]:
    """The chosen law in one sentence: how it was chosen, how stable the choice is, its exponents; REPORT
    has the candidates, the splits and the tests."""
    selection = law.get("selection")
    if not law.get("name"):
        return []
    params = law.get("params") or {}
    text = f"- **Which law.** `{law['name']}`"
    if selection:
        scores = {c["name"]: c for c in selection["candidates"] if c.get("score") is not None and not c.get("degenerate")}
        best = min(scores.values(), key=lambda c: c["score"]) if scores else None
        pt = selection.get("precision_test") or {}
        text += (", chosen on strict held-out splits of the precision gaps"
                 + (f" as the law with the fewest params within noise of the best (`{best['name']}`)"
                    if best and best["name"] != law["name"] and (scores.get(law["name"]) or {}).get("within_noise") else "")
                 + (f"; it beats `chinchilla`, which has no precision term (p = {pt['p_value']:.2g})"
                    if pt.get("beats") and pt.get("p_value") is not None else ""))
        share = (selection.get("stability") or {}).get(law["name"])
        if share is not None:
            text += f"; chosen in {share:.0%} of {selection.get('stability_resamples')} cell resamples"
    if {"alpha", "beta"} <= set(params):
        a, b = params["alpha"], params["beta"]
        split = b / (a + b)
        lo, hi = fit.LITERATURE_SPLIT
        text += f". Exponents alpha {a:.2f}, beta {b:.2f}: N\\* ∝ C^{split:.2f}"
        if not lo <= split <= hi:
            text += f" (outside the published {lo:g}–{hi:g}, so not extrapolated to cluster scale)"
    heldout = law.get("heldout")
    if heldout and heldout.get("mare") is not None:
        text += f"; error on the largest {heldout['by']} held out {heldout['mare']:.1%}"
    return [text + "."]


def _pstar(f: dict) -> list[str]:
    """P* at the largest budget in one bullet: the measured recipes first (what the IsoFLOP measurement
    cannot rule out), then the chosen law's continuous P* and its best format (REPORT has every budget, the
    formats within the law's error and which are untrained)."""
    if not f.get("P_star"):
        return ["- **P\\***: no precision-aware law was fitted, so there is no P\\*."]
    e = f["P_star"][-1]
    head = f"- **P\\*** at C = {_num(e['compute'])}: "
    if "error" in e:
        return [head + f"no P\\* ({e['error']})."]
    measured = e.get("measured") or []
    ruled = ("the measurement cannot rule out " + ", ".join(f"{m['recipe']} ({m['bits']:.3g} bits)" for m in measured)
             if measured else "")
    if e.get("no_bits_axis"):
        # a law on quantisation errors ranks the measured recipes: a choice among them, not an interval
        ranked = e.get("recipes") or []
        choice = ([ranked[0]] if ranked else []) + [m for m in measured if m["recipe"] not in {r["recipe"] for r in ranked[:1]}]
        names = ", ".join(f"{c['recipe']} ({c['bits']:.3g} bits)" for c in choice) or "none"
        return [head + f"**{names}**: a choice among measured recipes, not an interval of P\\* "
                f"(`{e['no_bits_axis']}` has no bits axis)."]
    profile = e.get("profile") or {}
    star = profile.get("pstar") or {}
    if star.get("P") is not None:
        law = (f"the law's continuous P\\* **{star['P']:.3g} bits**"
               + (f" (95% CI {star['ci'][0]:.3g}–{star['ci'][1]:.3g})" if star.get("ci") else ""))
    else:
        ci = f", bootstrap 95% CI {e['P_ci'][0]:.3g}–{e['P_ci'][1]:.3g}" if e.get("P_ci") else ""
        law = f"**{_bits(e.get('law_interval') or e['interval'])}** (the law's P\\* {e['P']:.3g} bits{ci})"
    if profile.get("rows"):
        rows = sorted(profile["rows"], key=lambda r: r["loss"])
        close = sum(r["loss"] - rows[0]["loss"] < (profile.get("law_error") or 0.0) * rows[0]["loss"] for r in rows[1:])
        law += (f"; of the formats chips run it ranks **{rows[0]['name']}** ({rows[0]['bits_per_element']:.3g} bits per "
                f"element) first, {close} other{'s' if close != 1 else ''} within its error ({profile['law_error']:.1%})")
    return [head + "; ".join(x for x in (ruled, law) if x) + "."]


def _gap(recipe: str, gap: float, ci: Sequence[float], inside: bool) -> str:
    """One recipe's gap to its reference with its 95% CI; a minimum at the edge of its sizes marked."""
    return f"{recipe} {gap:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" + ("" if inside else " (edge)")


def _granularity(g: dict, unit: str) -> list[str]:
    """One sentence: per format, the schemes that lower (or raise) the loss against per-tensor scaling."""
    head = f"- **Scaling granularity** ({g['runs']} runs; each scheme minus per-tensor scaling, paired by seed"
    if g.get("sigma") is None:
        return [head + "): no scheme has two seeds, so every comparison is *cannot tell*."]
    said = []
    for fmt in sorted({r["format"] for r in g["rows"]}, reverse=True):
        rows = [r for r in g["rows"] if r["format"] == fmt]
        parts = [f"{v} with {', '.join(_scheme(r) for r in rows if r['verdict'] == v)} (by "
                 f"{_span(sorted(abs(r['diff']) for r in rows if r['verdict'] == v), '.2f')})"
                 for v in ("lower", "higher") if any(r["verdict"] == v for r in rows)]
        said.append(f"{fmt} {'; '.join(parts) if parts else 'cannot tell'}")
    return [head + f"; {g['level']:.0%} simultaneous over {g['comparisons']} comparisons, {unit}): " + "; ".join(said) + "."]


def _outliers(o: dict, unit: str) -> list[str]:
    if not o.get("n") or o.get("ci") is None:
        return [f"- **Outliers** (Smooth-SwiGLU on and off, {o['runs']} runs): no pair with a noise estimate: cannot tell."]
    return [f"- **Outliers** ({o['runs']} runs): Smooth-SwiGLU on minus off, {o['diff']:+.3f} {unit} "
            f"({o['level']:.0%} CI {o['ci'][0]:+.3f} to {o['ci'][1]:+.3f}, {o['n']} pairs): {o['verdict']}."]


def _scheme(row: dict) -> str:
    name = "per tensor" if row["granularity"] == "tensor" else row["granularity"]
    return f"{name} ({row['scaling']})" if row["scaling"] != "current" else name


def _bits(interval: Sequence[float]) -> str:
    lo, hi = interval
    return f"{lo:.3g} bits" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}–{hi:.3g} bits"


def _span(values: Sequence[Any], spec: str = "g") -> str:
    lo, hi = min(values), max(values)
    return format(lo, spec) if format(lo, spec) == format(hi, spec) else f"{format(lo, spec)}–{format(hi, spec)}"


def _first_sentence(text: str) -> str:
    """text up to its first full stop outside parentheses and brackets (a README bullet's claim; REPORT has the rest)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch in "([") - (ch in ")]")
        if ch == "." and depth == 0 and text[i + 1:i + 2] in (" ", "") and not text[max(0, i - 3):i].strip().isdigit():
            return text[:i + 1]
    return text


def _num(x: float) -> str:
    return f"{x:.3g}".replace("e+", "e")
