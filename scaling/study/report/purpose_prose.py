"""REPORT.md's sentences about the purpose sweeps: the granularity sweep (each scaling scheme against
per-tensor current scaling in the same format, paired by seed, simultaneous intervals; findings.scheme_effects)
and the outlier sweep (Smooth-SwiGLU on minus off, paired by recipe, learning rate and seed;
findings.smooth_swiglu_effect). Each section opens with its headline, README's line for it.

Apart from scaling.study.report.prose (the main study's measurements and the formatting every section
shares): these sweeps answer their own questions, on their own runs, and their sentences need none of
prose's helpers. prose imports this module and re-exports its public names; this module imports no other
report module.
"""

from __future__ import annotations

from typing import Any, Sequence


def granularity_headline(g: dict, unit: str) -> str:
    """The granularity section's first sentence (README's line): per format, the schemes whose loss is lower
    (or higher) than per-tensor scaling's beyond the simultaneous intervals, with the size of the difference."""
    head = f"Each scheme minus per-tensor scaling, paired by seed ({g['runs']} runs"
    if g.get("sigma") is None:
        return head + "): no scheme has two seeds, so every comparison is *cannot tell*."
    said = []
    for fmt_name in sorted({r["format"] for r in g["rows"]}, reverse=True):
        rows = [r for r in g["rows"] if r["format"] == fmt_name]
        parts = [f"{d} with {', '.join(_scheme(r) for r in rows if r['verdict'] == d)} (by "
                 f"{_values_span(sorted(abs(r['diff']) for r in rows if r['verdict'] == d), '.2f')})"
                 for d in ("lower", "higher") if any(r["verdict"] == d for r in rows)]  # `verdict`: the direction
        said.append(f"{fmt_name} {'; '.join(parts) if parts else 'cannot tell'}")
    return head + f"; {g['level']:.0%} simultaneous over {g['comparisons']} comparisons, {unit}): " + "; ".join(said) + "."


def _scheme(row: dict) -> str:
    name = "per tensor" if row["granularity"] == "tensor" else row["granularity"]
    return f"{name} ({row['scaling']})" if row["scaling"] != "current" else name


def _values_span(values: Sequence[Any], spec: str = "g") -> str:
    lo, hi = min(values), max(values)
    return format(lo, spec) if format(lo, spec) == format(hi, spec) else f"{format(lo, spec)}–{format(hi, spec)}"


def granularity_section(g: dict, unit: str) -> str:
    """The granularity sweep (findings.scheme_effects): each scheme against per-tensor current scaling."""
    lines = [granularity_headline(g, unit), "",
             f"Each scaling scheme against per-tensor, current scaling in the same format, final validation loss "
             f"paired by seed ({g['runs']} runs, {g['comparisons']} comparisons)."]
    if g["sigma"] is None:
        lines[-1] += (" No scheme has two seeds, so there is no noise estimate and no difference can be told from "
                      "seed noise: every comparison is *cannot tell*.")
    else:
        own = [r["recipe"] for r in g["rows"] if r.get("own_noise")]
        apart = f" (apart from {', '.join(own)}, whose paired scatter is far above the rest's by an F test: each keeps its own)"
        lines[-1] += (f" Scatter of the paired differences, pooled over the comparisons: {g['sigma']:.3f} {unit} on "
                     f"{g['dof']} dof{apart if own else ''}; intervals are simultaneous {g['level']:.0%} over all "
                     f"{g['comparisons']} comparisons (Bonferroni).")
        counts = {d: sum(r["verdict"] == d for r in g["rows"]) for d in ("lower", "higher", "cannot tell")}
        lines[-1] += f" Lower than per tensor: {counts['lower']}; higher: {counts['higher']}; cannot tell: {counts['cannot tell']}."
    lines += ["", "| format | scheme | seeds | loss | per-tensor loss | difference | CI | direction |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(g["rows"], key=lambda r: (r["format"], r["diff"])):
        ci = f"{r['ci'][0]:+.3f} to {r['ci'][1]:+.3f}" if r["ci"] else "–"
        if r.get("own_noise") and r["n"] <= 2:  # its own scatter from one degree of freedom: t's tail is the interval
            ci = f"cannot be estimated (its own scatter, {r['n'] - 1} dof)"
        lines.append(f"| {r['format']} | {r['recipe']} | {r['n']} | {r['loss']:.4g} | {r['loss_ref']:.4g} | "
                     f"{r['diff']:+.3f} | {ci} | {r['verdict']} |")
    lines += _not_ok_lines(g["not_ok"], "recipe")
    return "\n".join(lines)


def outliers_headline(o: dict, unit: str) -> str:
    """The outlier section's first sentence (README's line): Smooth-SwiGLU on minus off, with its CI and
    direction, or why there is none."""
    if not o["n"]:
        return f"{o['runs']} runs, but no pair with Smooth-SwiGLU on and off that both finished: nothing to compare."
    if o["ci"] is None:
        return (f"Smooth-SwiGLU on minus off, final validation loss ({o['runs']} runs): {o['diff']:+.3f} {unit} from "
                "one pair, with no noise estimate: cannot tell.")
    say = {"lower": "lower with Smooth-SwiGLU", "higher": "higher with Smooth-SwiGLU", "cannot tell": "cannot tell"}
    return (f"Smooth-SwiGLU on minus off, final validation loss paired by recipe, learning rate and seed ({o['runs']} "
            f"runs): {o['diff']:+.3f} {unit} ({o['level']:.0%} CI {o['ci'][0]:+.3f} to {o['ci'][1]:+.3f}, n = {o['n']} "
            f"pairs): {say[o['verdict']]}.")


def outliers_section(o: dict, unit: str) -> str:
    """The outlier sweep (findings.smooth_swiglu_effect): Smooth-SwiGLU on minus off."""
    lines = [outliers_headline(o, unit), "", "| recipe | learning rate | seed | loss, off | loss, on | on − off |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {p['recipe']} | {p['lr']:g} | {p['seed']} | {p['off']:.4g} | {p['on']:.4g} | {p['on'] - p['off']:+.3f} |"
              for p in o["pairs"]]
    return "\n".join(lines + _not_ok_lines(o["not_ok"], "Smooth-SwiGLU"))


def _not_ok_lines(not_ok: dict, what: str) -> list[str]:
    if not not_ok:
        return ["", "Every run finished ok."]
    return ["", "Runs that did not finish ok (not compared): " + "; ".join(
        f"{what} {k}: " + ", ".join(f"{n} {s}" for s, n in v.items()) for k, v in not_ok.items()) + "."]
