import subprocess
import sys

from scaling import cli


def test_help_lists_every_verb(capsys):
    try:
        cli.main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for verb in cli.VERBS:
        assert verb in out


def test_unknown_verb_is_a_one_line_error():
    proc = subprocess.run([sys.executable, "-m", "scaling.cli", "frobnicate"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "frobnicate" in proc.stderr and "invalid choice" in proc.stderr


def test_planning_and_help_do_not_load_jax():
    """The lazy imports that remain exist for this: `scaling plan` (with or without a fit), the
    fitting stack's readers and `sweep --help` run without JAX (seconds on a laptop)."""
    code = ("import sys\n"
            "from scaling import cli, fit, optimal, plan, results, sweep\n"
            "try:\n"
            "    cli.main(['sweep', '--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print(sorted(m for m in ('jax', 'ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
