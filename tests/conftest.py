import os
import sys
from pathlib import Path

# One OpenBLAS thread in the test processes and every process they start (set before numpy loads it):
# on the 2-core CI machine, with both pytest-xdist workers and XLA's threads busy, OpenBLAS's spinning
# threads made each tiny BLAS call of scipy's L-BFGS-B (the fits' float64 polish) wait milliseconds,
# a fit on 18 rows 45 s of CPU instead of 7. Same numbers either way (the calls are too small to split).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if "numpy" in sys.modules:  # too late for this process: say so rather than run slow unnoticed
    print("tests/conftest.py: numpy was imported before OPENBLAS_NUM_THREADS=1 could take effect", file=sys.stderr)

# The reference study's own modules (paper_figures/reference_study.py, readme.py) live with the study,
# not in the package: tests import them from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "paper_figures"))
