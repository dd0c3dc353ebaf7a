"""The package tree shows the architecture: imports flow one way, function-level imports included.

numerics <- train <- study; plan is pure Python (never JAX) and imports only itself and the base
modules; cli sits on top and may import anything. No module imports another that imports it back.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "scaling"
BASE = {"scaling", "scaling._io", "scaling._lazy", "scaling.errors", "scaling.host"}
# package -> the packages its modules may import (besides its own and BASE)
ALLOWED = {
    "numerics": set(),
    "plan": set(),
    "train": {"numerics", "plan"},
    "study": {"numerics", "train", "plan"},
    "cli": {"numerics", "train", "study", "plan"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every scaling module `path` imports anywhere in its body (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out.update(n for n in names if n.startswith("scaling") and n in modules)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {m: _imports(p, modules) - {m} for m, p in modules.items()}
    # importing a submodule runs its package's __init__, which only holds lazy names
    return graph


def test_every_import_follows_the_layers():
    bad = []
    for module, targets in _graph().items():
        if module in BASE:
            bad += [f"{module} -> {t}" for t in targets if t not in BASE]
            continue
        package = module.split(".")[1]
        for t in targets:
            if t in BASE:
                continue
            if t.split(".")[1] not in ALLOWED[package] | {package}:
                bad.append(f"{module} -> {t}")
    assert not bad, "imports against the layers: " + "; ".join(sorted(bad))


# scaling.study's wings -> the wings their modules may import (besides their own): analysis reads
# DataFrames and never how they were made or shown; sweeps read the fit's run-count rule, never the report
WINGS = {"analysis": set(), "sweeps": {"analysis"}, "report": {"analysis", "sweeps"}}


def test_the_study_wings_import_one_way():
    bad = []
    for module, targets in _graph().items():
        parts = module.split(".")
        if parts[:2] != ["scaling", "study"] or len(parts) < 4 or parts[2] not in WINGS:
            continue
        for t in targets:
            wing = t.split(".")[2] if t.startswith("scaling.study.") else None
            if wing in ("sweeps", "analysis", "report", "reproduce", "presets") and wing != parts[2] \
                    and wing not in WINGS[parts[2]]:
                bad.append(f"{module} -> {t}")
    assert not bad, "imports against the study's wings: " + "; ".join(sorted(bad))


def test_the_old_flat_study_paths_import_the_moved_modules():
    """`scaling.study.fit`, `from scaling.study.sweep import expand`, `scaling.study.analysis.ok_rows`,
    `scaling.study.report.write_report`: the wings' modules under their old names, for one release."""
    import importlib

    import scaling.study

    for old, new in scaling.study.MOVED.items():
        assert importlib.import_module(f"scaling.study.{old}") is importlib.import_module(f"scaling.study.{new}"), old
        assert getattr(scaling.study, old) is importlib.import_module(f"scaling.study.{new}"), old
    from scaling.study import analysis, report
    from scaling.study.analysis import isoflop
    from scaling.study.report import writer
    assert analysis.ok_rows is isoflop.ok_rows and report.write_report is writer.write_report


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(cycles)


@pytest.mark.parametrize("package", ["scaling.plan"])
def test_planner_never_imports_jax(package):
    modules = sorted(m for m in _modules() if m == package or m.startswith(package + "."))
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + \
        "print(sorted(m for m in ('jax', 'numpy', 'scipy', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


# The sizes: a module over 600 lines or a function over 80 says why it is one piece.
MODULE_LINES, FUNCTION_LINES = 600, 80


def test_a_long_module_says_why_it_is_one_module():
    long = [m for m, p in _modules().items() if len(p.read_text().splitlines()) > MODULE_LINES]
    unexplained = [m for m in long if "One module" not in (ast.get_docstring(ast.parse(_modules()[m].read_text())) or "")]
    assert not unexplained, f"over {MODULE_LINES} lines with no 'One module: <reason>' in the docstring: {unexplained}"


def test_a_long_function_says_why_it_is_one_function():
    unexplained = []
    for m, p in _modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES and "One function" not in (ast.get_docstring(node) or ""):
                    unexplained.append(f"{m}.{node.name} ({lines} lines)")
    assert not unexplained, f"over {FUNCTION_LINES} lines with no 'One function: <reason>': {unexplained}"
