"""What `scaling reproduce` offers, without the study stack: its presets and its default worker count
(scaling.study.reproduce runs them; `scaling reproduce --help` lists them with no pandas or JAX)."""

from __future__ import annotations

import os

# preset -> the sweeps it runs; the first one is the IsoFLOP study the law is fitted on, the others
# feed their own figures.
STUDY_PRESETS = {
    "quick": ["quick.toml"],
    "full": ["isoflop.toml", "isoflop_heldout.toml", "granularity.toml", "outliers.toml"],
}
# preset -> its study's own REPORT sections (scaling.study.report.load_sections), relative to the repository
SECTIONS = {"full": "paper_figures/reference_study.py"}
WORKERS = min(4, os.cpu_count() or 1)  # small models leave cores idle: 2 runs on 2 cores took 4 min, not 8
