import os
import sys
from pathlib import Path

# One BLAS thread per test process, set before numpy loads OpenBLAS: pytest-xdist already runs one process
# per core, and OpenBLAS's own threads on top oversubscribe them; scipy's polish of a 13-param fit took
# 12.8 s of CPU with OpenBLAS's default threads under -n 2 on the 2-core machine, 0.05 s with one.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if "numpy" in sys.modules:  # too late for this process: say so rather than run slow unnoticed
    print("tests/conftest.py: numpy was loaded before OPENBLAS_NUM_THREADS=1 could take effect", file=sys.stderr)

# The reference study's own modules (paper_figures/reference_study.py, readme.py) live with the study,
# not in the package: tests import them from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "paper_figures"))
