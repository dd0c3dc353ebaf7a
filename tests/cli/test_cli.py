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
            "from scaling import cli, fit, optimal, plan, results\n"
            "from scaling.study import sweep\n"
            "try:\n"
            "    cli.main(['sweep', '--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print(sorted(m for m in ('jax', 'ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


class _Exec(Exception):
    pass


def test_no_verb_re_executes_itself_and_the_process_env_stays_explicit(monkeypatch):
    """malloc's huge pages take effect only at process start, yet no verb re-executes itself to get
    them (a debugger or profiler keeps the process it started): `scaling train|sweep|reproduce`
    leave exec and the environment alone. Sweeps start their runs' processes with host.PROCESS_ENV
    (tests/study/test_sweep.py); a single run and the benchmarks use what the user exported, and
    the benchmarks' header line says which."""
    import os

    from scaling import host

    calls = []

    def no_exec(*args):
        calls.append(args)
        raise _Exec

    for name in ("execv", "execve", "execvp", "execvpe"):
        monkeypatch.setattr(os, name, no_exec)
    monkeypatch.setattr(host.platform, "system", lambda: "Linux")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for verb in ("train", "sweep", "reproduce"):
        monkeypatch.setattr(sys, "argv", ["/venv/bin/scaling", verb, "--help"])
        try:
            cli.main()  # argv from sys.argv, as the console script runs it
        except SystemExit as e:
            assert e.code == 0
        assert calls == [] and "GLIBC_TUNABLES" not in os.environ
    assert host.process_env(os.environ) == host.PROCESS_ENV  # what a sweep's run process gets
    assert host.process_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == {}  # a user's own wins
    assert host.process_env({}, system="Darwin") == {}  # no glibc
    assert host.process_env_status({}) == ("malloc huge pages off (GLIBC_TUNABLES unset; "
                                           "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 turns them on)")
    assert host.process_env_status(host.PROCESS_ENV) == "malloc huge pages on (GLIBC_TUNABLES=glibc.malloc.hugetlb=1)"
    assert host.process_env_status({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"}).startswith(
        "malloc huge pages off (")
    assert host.process_env_status({}, system="Darwin") == "malloc: no glibc tunables"


def test_the_process_env_cuts_page_faults_of_malloc_scratch():
    """What PROCESS_ENV is for, measured in a child process: 64 MiB blocks allocated, written and freed
    in a loop fault their pages in every time under glibc's defaults; with huge pages through madvise
    (the kernel's THP mode 'madvise', as on our machines) ~512x fewer. In mode 'never' it cannot help,
    in 'always' both fault little: there the setting must at least cost no faults."""
    import os
    import re
    from pathlib import Path

    from scaling import host

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    mode = re.search(r"\[(\w+)\]", thp.read_text()).group(1) if thp.exists() else "none"
    code = ("import ctypes, resource\n"
            "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]\n"
            "n = 64 << 20\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(8):\n"
            "    p = libc.malloc(n); ctypes.memset(p, 1, n); libc.free(p)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    plain = int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
    huge = int(subprocess.run([sys.executable, "-c", code], env={**env, **host.PROCESS_ENV},
                              capture_output=True, text=True, check=True).stdout)
    every_page = 8 * (64 << 20) // 4096
    assert huge <= 1.1 * plain + 64
    if mode == "madvise":
        assert plain >= 0.9 * every_page  # every 4 KiB page, every time
        assert huge < plain / 10
    elif mode == "never":
        assert huge >= 0.9 * every_page
