"""`scaling` command line: one verb per module, imported only when used (so `scaling plan` never loads JAX).

Each verb's module defines `add_arguments(parser)` and `main(args) -> int`; a verb's subcommands
(`scaling plan step`) are verbs of their own in SUBVERBS, each its own module. A verb module imports
the library modules it runs on inside `main` (or the helpers `main` calls), so `scaling VERB --help`
loads no numpy, pandas, scipy or JAX (tests/cli/test_help.py).
A `ConfigError` anywhere becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from scaling.errors import ConfigError

# verb -> (module defining add_arguments/main, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "train": ("scaling.cli.train", "train one run from a TOML config"),
    "sweep": ("scaling.cli.sweep", "run a grid of runs from an experiment TOML (an [isoflop] table makes it an IsoFLOP design)"),
    "fit": ("scaling.cli.fit", "fit a scaling law to results (--law auto: chosen by held-out precision gaps)"),
    "predict": ("scaling.cli.predict", "predict a held-out budget before it is trained; any runs (--rows); backtests (--backtest)"),
    "optimal": ("scaling.cli.optimal", "a fitted law at the formats chips run (a P* profile), and its compute-optimal (N, D, P)"),
    "merge": ("scaling.cli.merge", "join a side summary (a held-out budget, a recipe added later) into a sweep's summary"),
    "figures": ("scaling.cli.figures", "regenerate figures, REPORT.md and findings.json from results/ and fits/"),
    "reproduce": ("scaling.cli.reproduce", "the main job: IsoFLOP sweep, law selection, findings, figures, report"),
    "plan": ("scaling.cli.plan", "training days and memory per GPU on a GPU cluster"),
}
# "VERB SUB" -> (module defining add_arguments/main, one-line help): a verb's subcommands
SUBVERBS: dict[str, tuple[str, str]] = {
    "plan step": ("scaling.cli.plan_step", "one training step op by op: time, memory per GPU, breakdown"),
    "plan validate": ("scaling.cli.plan_validate", "the step model against published runs"),
}


def version() -> str:
    """The installed distribution's version (the package's own when run from a source tree)."""
    from importlib import metadata

    try:
        return metadata.version("scaling")
    except metadata.PackageNotFoundError:
        from scaling import __version__

        return __version__


def _subverbs(verb: str) -> dict[str, tuple[str, str]]:
    return {name: entry for name, entry in SUBVERBS.items() if name.split()[0] == verb}


def _top_level_parser() -> argparse.ArgumentParser:
    listed = {name: h for verb, entry in VERBS.items() for name, (_, h) in {verb: entry, **_subverbs(verb)}.items()}
    width = max(map(len, listed))
    parser = argparse.ArgumentParser(
        prog="scaling",
        description="Precision-aware scaling-law toolkit.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="verbs:\n" + "\n".join(f"  {name:<{width}}  {h}" for name, h in listed.items())
        + "\n\nrun `scaling VERB --help` for a verb's options",
    )
    parser.add_argument("--version", action="version", version=f"scaling {version()}",
                        help="print the installed version and exit")
    parser.add_argument("verb", choices=list(VERBS), metavar="VERB")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in VERBS:
        _top_level_parser().parse_args(argv[:1] or ["--help"])  # prints help, the version or a one-line error
        return 2
    verb, rest = argv[0], argv[1:]
    module_name, help_line = VERBS[verb]
    subverbs = _subverbs(verb)
    if rest and f"{verb} {rest[0]}" in subverbs:  # `scaling plan step`: a module of its own
        verb, rest = f"{verb} {rest[0]}", rest[1:]
        module_name, help_line = subverbs[verb]
        subverbs = {}
    epilog = ("subcommands: " + "; ".join(f"`scaling {name}` ({h})" for name, (_, h) in subverbs.items())
              + f"; `scaling {verb} SUB --help` for their options") if subverbs else None
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"scaling {verb}", description=help_line, epilog=epilog)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.main(args) or 0)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C where a verb has no stop of its own: one line, the shell's 130
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `scaling plan ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
