"""`scaling VERB [SUB] --help` and `scaling --version`: every verb answers without importing the library's
heavy stack (the verb's module imports it inside main), lists its options with help text and spells the
output flag one way; the top-level help lists every verb and subcommand."""

import argparse
import importlib
import json
import subprocess
import sys
from importlib import metadata

import pytest

from scaling import cli

HEAVY = ("jax", "pandas", "scipy", "matplotlib", "seaborn", "orbax", "flax", "optax")
COMMANDS = [*cli.VERBS, *cli.SUBVERBS]  # "plan step": a subcommand, its words as on the command line


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)


def _parser(command: str) -> argparse.ArgumentParser:
    module_name, help_line = {**cli.VERBS, **cli.SUBVERBS}[command]
    parser = argparse.ArgumentParser(prog=f"scaling {command}", description=help_line)
    importlib.import_module(module_name).add_arguments(parser)
    return parser


@pytest.mark.parametrize("command", COMMANDS)
def test_help_imports_no_heavy_module(command):
    """In a fresh process, `scaling COMMAND --help` exits 0, prints the usage and leaves every heavy
    package out of sys.modules."""
    code = ("import json, sys\n"
            "from scaling import cli\n"
            "try:\n"
            f"    cli.main({[*command.split(), '--help']!r})\n"
            "    code = 'returned'\n"
            "except SystemExit as e:\n"
            "    code = e.code\n"
            f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
            "print(json.dumps({'code': code, 'heavy': heavy}))\n")
    proc = _python(code)
    *help_lines, last = proc.stdout.strip().splitlines()
    found = json.loads(last)
    assert found == {"code": 0, "heavy": []}, f"scaling {command} --help: {found}"
    assert help_lines[0].startswith(f"usage: scaling {command} ")


def test_version():
    proc = subprocess.run([sys.executable, "-m", "scaling.cli", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0
    assert proc.stdout == f"scaling {metadata.version('scaling')}\n"


def test_top_level_help_lists_every_verb_and_subcommand():
    proc = subprocess.run([sys.executable, "-m", "scaling.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    listed = {line.split("  ")[1].strip() for line in proc.stdout.splitlines() if line.startswith("  ") and "  " in line[2:]}
    assert set(COMMANDS) <= listed, f"missing from `scaling --help`: {sorted(set(COMMANDS) - listed)}"
    assert "--version" in proc.stdout


@pytest.mark.parametrize("verb", sorted({sub.split()[0] for sub in cli.SUBVERBS}))
def test_a_verbs_help_lists_its_subcommands(verb, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([verb, "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog
    for sub in cli.SUBVERBS:
        if sub.split()[0] == verb:
            assert f"`scaling {sub}`" in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_and_the_output_flag_is_o_out(command):
    parser = _parser(command)
    for action in parser._actions:
        assert action.help, f"scaling {command}: {action.option_strings or action.dest} has no help text"
        assert "--output" not in action.option_strings, f"scaling {command}: --output is spelled -o/--out"
        if "--out" in action.option_strings or "-o" in action.option_strings:
            assert action.option_strings == ["-o", "--out"] and action.dest == "out", f"scaling {command}: {action}"


@pytest.mark.slow
def test_the_help_names_match_the_library():
    """scaling.cli._names copies names whose library home is heavy to import; they must match it
    (a fresh process: the law registry as the command line sees it)."""
    code = ("import json\n"
            "from scaling.study import laws\n"
            "from scaling.train import compute\n"
            "print(json.dumps({'LAWS': laws.names(), 'COST_MODELS': list(compute.COST_MODELS)}))\n")
    library = json.loads(_python(code).stdout.strip().splitlines()[-1])
    from scaling.cli import _names

    assert {"LAWS": list(_names.LAWS), "COST_MODELS": list(_names.COST_MODELS)} == library
