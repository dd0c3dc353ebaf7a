"""Analysis: what a study's results say. Law forms, fitting and law selection, the IsoFLOP analysis
(`isoflop`, whose names this package also exports: it was `scaling.study.analysis`), shape effects,
matched-token gaps, verdicts under each cost model, findings; P* (`pstar`) and prediction
(`prediction`). Imports neither the sweeps nor the report wing."""

from scaling._lazy import exports

_ISOFLOP = ("sweep_family", "study_part", "ok_rows", "high_precision_recipe", "with_cost", "points_at", "shape_label",
            "default_budgets", "replicate_noise", "isoflop", "pair_verdict", "analyse", "gaps_to_reference_recipe",
            "MATCH_RTOL", "MIN_SIZES", "LEVEL", "PURPOSE_SWEEPS")
_NAMES = {**{m: m for m in ("laws", "fit", "selection", "heldout", "shapes", "matched", "costs", "findings", "pstar", "prediction")},
          **{name: "isoflop" for name in _ISOFLOP}}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
