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
             f"{f['runs']} IsoFLOP runs ({_span(f['seeds_per_cell'])} seeds per size, recipe and token count); loss in "
             f"{unit}. REPORT.md opens with the same answer:", "", prose.answer_section(f), ""]
    lines += _corpora(f)
    lines += _prediction(f, unit)
    lines += _law(f.get("law") or {})
    lines += _pstar(f)
    if f.get("granularity"):
        lines += _granularity(f["granularity"], unit)
    if f.get("outliers"):
        lines += _outliers(f["outliers"], unit)
    lines += _gpu_pilot(f.get("gpu_pilot"), unit)
    lines += ["", "[REPORT.md](paper_figures/REPORT.md) has the rest: the IsoFLOP profiles of the `bits` design, every "
                  "recipe on every chip, P\\* at every budget, the integer and FP4 arms, the backtests and the figures."]
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
    corpus = f", on that machine's corpus ({g['corpus']})" if g.get("corpus") else ""
    head = (f"- **The GPU pilot** ({g['runs']} runs of `experiments/gpu_pilot.toml` on a GPU{corpus}, compared only "
            f"with each other; [docs/gpu.md](docs/gpu.md)):")
    if not g.get("budgets"):
        return [head + " no budget has IsoFLOP profiles yet: cannot tell."]
    lines = [head]
    for b in g["budgets"]:
        text = f"  - C = {_num(b['budget'])}: {_first_sentence(_verdict(b, unit))}"
        reference = next((e["recipe"] for e in b["recipes"] if e.get("gap") is None and e.get("loss") is not None), None)
        gaps = sorted((e for e in b["recipes"] if e.get("gap") is not None and e.get("gap_ci")), key=lambda e: e["gap"])
        if reference and gaps:
            text += (f" Against {reference} (IsoFLOP minimum minus the reference's, 95% CI): "
                     + "; ".join(_gap(e["recipe"], e["gap"], e["gap_ci"], e.get("inside", True)) for e in gaps) + ".")
        lines.append(text)
    return lines


def _law(law: dict) -> list[str]:
    selection = law.get("selection")
    if not law.get("name"):
        return []
    params = law.get("params") or {}
    text = f"- **Which law.** `{law['name']}`"
    if selection:
        scores = {c["name"]: c for c in selection["candidates"] if c.get("score") is not None}
        chosen = scores.get(selection["chosen"])
        others = sorted((c for n, c in scores.items() if n != selection["chosen"]), key=lambda c: c["score"])
        if chosen is not None:
            pt = selection.get("precision_test") or {}
            splits = " and ".join(selection.get("splits") or []) or "one"
            text += (f", chosen by held-out precision gaps (mean absolute error {chosen['score']:.3f} nats over the "
                     f"{splits} splits" + (f"; it beats `chinchilla`, which has no precision term: p = {pt['p_value']:.2g}, "
                                              f"{pt['n_clusters']} (N, seed) clusters, {pt['n']} held-out gaps"
                                           if pt.get("beats") and pt.get("p_value") is not None else "") + ")")
        close = [c for c in others if c.get("within_noise")]
        if close:
            text += f"; {len(close)} other law{'s' if len(close) > 1 else ''} within noise of it (REPORT names them)"
    if {"alpha", "beta"} <= set(params):
        a, b = params["alpha"], params["beta"]
        split = b / (a + b)
        lo, hi = fit.LITERATURE_SPLIT
        text += f". Exponents alpha {a:.2f}, beta {b:.2f}: N\\* ∝ C^{split:.2f}"
        if not lo <= split <= hi:
            text += f" (outside the published {lo:g}–{hi:g}, so not extrapolated to cluster scale)"
    heldout = law.get("heldout")
    if heldout and heldout.get("mare") is not None:
        text += (f"; error on the largest {heldout['by']} held out {heldout['mare']:.1%} "
                 f"({heldout['n_test']} points)")
    return [text + "."]


def _pstar(f: dict) -> list[str]:
    if not f.get("P_star"):
        return ["- **P\\***: no precision-aware law was fitted, so there is no P\\*."]
    profiled = any((e.get("profile") or {}).get("rows") for e in f["P_star"])
    lines = ["- **P\\*, as a profile over the formats chips run** (the law's loss at each format's compute-optimal N, "
             "formats within the law's error not told apart; REPORT has every budget):"
             if profiled else
             "- **P\\*, the compute-optimal precision** (the law's choice and what the measurement cannot rule out; "
             "REPORT has every budget):"]
    for e in f["P_star"][-1:]:  # the largest budget; REPORT has each
        head = f"  - C = {_num(e['compute'])}: "
        if "error" in e:
            lines.append(head + f"no P\\* ({e['error']}).")
            continue
        if e.get("no_bits_axis"):
            # a law on quantisation errors ranks the measured recipes: a choice among them, not an interval
            ranked = e.get("recipes") or []
            choice = [ranked[0]] if ranked else []
            choice += [m for m in e.get("measured") or [] if m["recipe"] not in {c["recipe"] for c in choice}]
            names = ", ".join(f"{c['recipe']} ({c['bits']:.3g} bits)" for c in choice) or "none"
            law_choice = f"; the law prefers {ranked[0]['recipe']}" if ranked else ""
            text = (f"**{names}**: a choice among measured recipes, not an interval of P\\* "
                    f"(`{e['no_bits_axis']}` has no bits axis{law_choice}")
        elif (e.get("profile") or {}).get("rows"):
            text = _profile(e["profile"], e)
        else:
            ci = f", bootstrap 95% CI {e['P_ci'][0]:.3g}–{e['P_ci'][1]:.3g}" if e.get("P_ci") else ""
            text = f"**{_bits(e.get('law_interval') or e['interval'])}** (the law's P\\* {e['P']:.3g} bits{ci}"
        measured = e.get("measured") or []
        if measured:
            text += "; the measurement cannot rule out " + ", ".join(f"{m['recipe']} ({m['bits']:.3g} bits)" for m in measured)
        if e.get("no_bits_axis") and (e.get("profile") or {}).get("rows"):  # drawn from a within-noise law
            text += f"); over the formats chips run, the `{e['profile']['law']}` law (within noise of it) puts " + _profile(e["profile"], e)
        if e.get("no_bits_axis"):  # README keeps the claim; REPORT has the profile of a law within noise beside it
            lines.append(head + text.split("; ")[0] + ").")
            continue
        lines.append(head + text + ("." if (e.get("profile") or {}).get("rows") else ")."))
    return lines


def _profile(p: dict, e: dict) -> str:
    """One budget's P* profile: the best format, those within the law's held-out error of it, and
    whether the law has a continuous P*."""
    rows = sorted(p["rows"], key=lambda r: r["loss"])
    best = rows[0]
    error = (p.get("law_error") or 0.0) * best["loss"]
    close = [r["name"] + (" (untrained)" if r.get("untrained") else "") for r in rows[1:] if r["loss"] - best["loss"] < error]
    text = (f"under `{p['cost_model'].split(',')[0]}`, **{best['name']}** ({best['bits_per_element']:.3g} bits per element"
            + (f", P(best) {best['p_best']:.2f}" if best.get("p_best") is not None else "") + ")")
    text += (f"; within the law's error ({p['law_error']:.1%}) of it: {', '.join(close)}" if close else
             "; no other format within the law's error of it")
    star = p.get("pstar") or {}
    if star.get("P") is not None:
        text += f"; continuous P\\* {star['P']:.3g} bits" + (f" (95% CI {star['ci'][0]:.3g}–{star['ci'][1]:.3g})" if star.get("ci") else "")
    else:
        text += f"; no continuous P\\* (`{p['law']}`" + (" reads integer exponent and mantissa bits" if e.get("P_grid") or "integer exponent" in str(star.get("reason")) else
                                                         ": none inside the trained bits") + ")"
    return text


def _gap(recipe: str, gap: float, ci: Sequence[float], inside: bool) -> str:
    """One recipe's gap to its reference with its 95% CI; a minimum at the edge of its sizes marked."""
    return f"{recipe} {gap:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" + ("" if inside else " (edge)")


def _granularity(g: dict, unit: str) -> list[str]:
    """One sentence: per format, the schemes that lower (or raise) the loss against per-tensor scaling."""
    head = f"- **Scaling granularity** ({g['runs']} runs, each scheme against per-tensor current scaling, paired by seed"
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
