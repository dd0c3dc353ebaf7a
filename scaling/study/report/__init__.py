"""Report: every figure, REPORT.md's sentences and the report itself with its `Section` hook for a
study's own sections (`writer`, whose names this package also exports: it was
`scaling.study.report`), and findings.json's versioned schema (`schema`). Reads the analysis wing's
facts; never imported by analysis or sweeps."""

from scaling._lazy import exports

_WRITER = ("Context", "Section", "write_report", "report_facts", "matched_facts", "cost_facts", "prediction_facts",
           "load_fit", "load_sections", "INTRODUCTION", "BUILT_IN")
_NAMES = {**{m: m for m in ("writer", "plots", "law_plots", "figure_base", "prose", "purpose_prose", "law_prose",
                           "prediction_prose", "schema")},
          **{name: "writer" for name in _WRITER}}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
