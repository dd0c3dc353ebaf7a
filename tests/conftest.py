import fcntl
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

# One BLAS thread per test process, set before numpy loads OpenBLAS: pytest-xdist already runs one process
# per core, and OpenBLAS's own threads on top oversubscribe them; scipy's polish of a 13-param fit took
# 12.8 s of CPU with OpenBLAS's default threads under -n 2 on the 2-core machine, 0.05 s with one.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if "numpy" in sys.modules:  # too late for this process: say so rather than run slow unnoticed
    print("tests/conftest.py: numpy was loaded before OPENBLAS_NUM_THREADS=1 could take effect", file=sys.stderr)

# The reference study's own modules (paper_figures/reference_study.py, readme.py) live with the study,
# not in the package: tests import them from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "paper_figures"))


def pytest_configure(config):
    """Every program a test compiles is kept in the persistent compilation cache and loaded by the
    next test run, whatever its compile time, as a sweep's runs keep theirs (the trainer alone keeps
    those of a second or more): most of what the suite compiles are quantisers and gradients of
    tenths of a second each, and the fast subset spent a third of its CPU compiling them again."""
    from scaling.study.sweeps import sweep

    sweep.use_compilation_cache()


@pytest.fixture(scope="session")
def once_per_run(tmp_path_factory):
    """`once(name, produce)` -> (directory, result): `produce(directory)` (returning something JSON can
    hold) runs once per pytest run, however many pytest-xdist workers ask: the first under a file lock,
    the others wait for it and read its result. For an expensive module fixture that xdist would
    otherwise make again in every worker its module's tests land on (CI made the smoke sweep twice).
    A produce that raises leaves nothing behind: the next asker tries again."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's, shared by its workers

    def once(name, produce):
        directory, done = root / f"once-{name}", root / f"once-{name}.json"
        with open(root / f"once-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not done.is_file():
                shutil.rmtree(directory, ignore_errors=True)
                directory.mkdir()
                result = produce(directory)
                done.write_text(json.dumps(result))
        return directory, json.loads(done.read_text())

    return once
