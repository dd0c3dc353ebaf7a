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
