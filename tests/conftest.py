import sys
from pathlib import Path

# The reference study's own modules (paper_figures/reference_study.py, readme.py) live with the study,
# not in the package: tests import them from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "paper_figures"))
