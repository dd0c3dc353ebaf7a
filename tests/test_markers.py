"""The fast subset, `pytest -q -n 2 -m "not slow"`, stays fast: a test that spawns a process
(subprocess, multiprocessing), starts Ray, or trains through the trainer (`loop.run`, `loop.run_packed`,
`scaling reproduce`) is marked slow: its module by `pytestmark = pytest.mark.slow`, or the test by
`@pytest.mark.slow`. Read from the test files' syntax, with no import: a test counts as doing what its own
body, the module's (or a conftest's) helper functions it names and the fixtures it asks for do. A guard,
not a proof: a test that trains some other way (a CLI verb in-process, an example module) is marked by
hand, from `pytest --durations`."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Tests that spawn a child doing almost nothing: a bare interpreter that only imports (a fresh process is
# the only way to see what an import loads), the pure-Python planner's command line, or a lock held across
# processes. Each took under 3 s of call time on a loaded 2-core machine, most under 1 s: they stay fast.
CHEAP_SPAWNS = {
    "cli/test_help.py::test_help_imports_no_heavy_module": "`scaling VERB --help` imports no heavy package",
    "cli/test_help.py::test_version": "`scaling --version`",
    "cli/test_help.py::test_top_level_help_lists_every_verb_and_subcommand": "`scaling --help`",
    "cli/test_cli.py::test_unknown_verb_is_a_one_line_error": "`scaling frobnicate`",
    "cli/test_cli.py::test_planning_and_help_do_not_load_jax": "planning imports no JAX",
    "cli/test_cli.py::test_the_process_env_cuts_page_faults_of_malloc_scratch": "malloc in a bare interpreter",
    "test_layout.py::test_planner_never_imports_jax": "`import scaling.plan` loads no JAX",
    "plan/test_plan_cli.py::test_cli_bad_arguments_are_one_line_errors": "`scaling plan`, refused",
    "plan/test_plan_cli.py::test_cli_memory_of_a_parameter_count_under_zero_3": "`scaling plan`",
    "plan/test_plan_cli.py::test_cli_prints_the_talk_table_from_the_step_model": "`scaling plan`",
    "plan/test_plan_cli.py::test_step_bad_inputs_are_one_line_errors": "`scaling plan step`, refused",
    "plan/test_plan_cli.py::test_step_model_is_pure_python": "the step model imports no JAX",
    "train/test_runs.py::test_lock_is_exclusive_across_processes": "a lock, two interpreters",
    "train/test_runs.py::test_inherited_lock_lives_while_parent_or_child_does": "a lock, two interpreters",
    "train/test_runs.py::test_sigkill_releases_the_lock": "a lock, two interpreters",
}


def _heavy_node(node: ast.AST, loop_names: set[str]) -> str | None:
    """What this one node does that makes a test slow, or None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner, attr = node.value.id, node.attr
        if owner == "subprocess":
            return "spawns a process (subprocess)"
        if owner == "multiprocessing":
            return "spawns a process (multiprocessing)"
        if owner == "ray" and attr == "init":
            return "starts Ray"
        if owner in loop_names and attr in ("run", "run_packed"):
            return f"trains ({owner}.{attr})"
        if owner == "reproduce" and attr == "reproduce":
            return "runs `scaling reproduce`"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "main" \
            and node.args and isinstance(node.args[0], ast.List) and node.args[0].elts \
            and isinstance(node.args[0].elts[0], ast.Constant) and node.args[0].elts[0].value == "reproduce":
        return "runs `scaling reproduce`"
    if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            a.name.split(".")[0] == "multiprocessing" for a in node.names) or (
            isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "multiprocessing"):
        return "spawns a process (multiprocessing)"
    return None


def _loop_names(tree: ast.Module) -> set[str]:
    """The names the trainer's loop module, or `scaling.train` (which exports its `run`), goes by in this
    file: `from scaling.train import loop as train`, `from scaling import train`."""
    names = {"loop"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("scaling.train", "scaling"):
            names |= {a.asname or a.name for a in node.names if a.name == {"scaling": "train"}.get(node.module, "loop")}
        elif isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name in ("scaling.train.loop", "scaling.train") and a.asname}
    return names


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _marked_slow(decorators: list[ast.expr]) -> bool:
    """`@pytest.mark.slow` on the test (or its class); a slow mark on some parameters does not count."""
    return any(ast.unparse(d).endswith("mark.slow") for d in decorators)


def _conftest_functions(path: Path) -> dict[str, ast.FunctionDef]:
    """Helpers and fixtures of the conftests above a test file, the nearest winning."""
    found: dict[str, ast.FunctionDef] = {}
    for folder in reversed([p for p in path.parents if p == TESTS or TESTS in p.parents]):
        conftest = folder / "conftest.py"
        if conftest.exists():
            found |= _functions(ast.parse(conftest.read_text(encoding="utf-8")))
    return found


def _unmarked_heavy_tests() -> dict[str, str]:
    """{test id: what it does} for each test that is slow by the rules above and not marked slow."""
    bad = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
               and "slow" in ast.unparse(n.value) for n in tree.body):
            continue
        loop_names = _loop_names(tree)
        helpers = _conftest_functions(path) | _functions(tree)
        tests = [(fn, []) for fn in _functions(tree).values()]
        tests += [(fn, cls.decorator_list) for cls in tree.body if isinstance(cls, ast.ClassDef)
                  for fn in cls.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for fn, class_decorators in tests:
            if not fn.name.startswith("test") or _marked_slow(fn.decorator_list + class_decorators):
                continue
            test_id = f"{path.relative_to(TESTS).as_posix()}::{fn.name}"
            seen, todo, why = set(), [fn], None
            while todo and why is None:  # the test, then every helper or fixture it reaches
                f = todo.pop()
                why = next((r for n in ast.walk(f) if (r := _heavy_node(n, loop_names))), None)
                names = {n.id for n in ast.walk(f) if isinstance(n, ast.Name)} | {a.arg for a in f.args.args}
                for name in names - seen:
                    seen.add(name)
                    if name in helpers and helpers[name] is not f:
                        todo.append(helpers[name])
            if why and test_id not in CHEAP_SPAWNS:
                bad[test_id] = why
    return bad


def test_every_test_that_spawns_starts_ray_or_trains_is_marked_slow():
    bad = _unmarked_heavy_tests()
    assert not bad, ("not marked slow (`@pytest.mark.slow`, or `pytestmark = pytest.mark.slow` for the module):\n"
                     + "\n".join(f"  {t}: {why}" for t, why in sorted(bad.items())))


def test_the_cheap_spawns_named_above_still_exist():
    for test_id in CHEAP_SPAWNS:
        file, name = test_id.split("::")
        tree = ast.parse((TESTS / file).read_text(encoding="utf-8"))
        assert name in _functions(tree), f"{test_id} is gone: take it out of CHEAP_SPAWNS"
