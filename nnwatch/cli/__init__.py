"""The ``nnwatch`` command. Each subcommand is its own module in this package.

A subcommand module defines ``COMMAND`` (its name), ``HELP`` (one line), ``add_arguments(parser)``
and ``run(args) -> int``; ``HIDDEN = True`` leaves out of the top-level help a command that
nnwatch runs on another host over ssh (``pack``, ``ranks``). Modules are found by name, so adding a command touches no shared file.
UI libraries are imported inside ``run`` only, so ``nnwatch ls`` stays fast and headless.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from types import ModuleType

DEFAULT_COMMAND = "pick"  # `nnwatch` alone opens the run picker


def _command_modules() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        name = getattr(mod, "COMMAND", None)
        if name:
            found[name] = mod
    return found


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    from nnwatch._version import __version__

    mods = _command_modules()
    parser = argparse.ArgumentParser(
        prog="nnwatch",
        description="Live monitor and debugger for PyTorch training runs.",
        epilog=(
            "nnwatch alone picks a run on this machine; nnwatch HOST the runs on another one,\n"
            "over your own ssh. nnwatch COMMAND --help says more about each command."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"nnwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in sorted(mods):
        mod = mods[name]
        about = str(getattr(mod, "HELP", ""))
        if getattr(mod, "HIDDEN", False):  # no help=: argparse leaves it out of the list
            p = sub.add_parser(name, description=about)
        else:
            p = sub.add_parser(name, help=about, description=about)
        mod.add_arguments(p)
    return parser, mods


def _looks_like_host(word: str) -> bool:
    """``nnwatch HOST`` lists the runs there; a word that is a near miss of a command is a typo
    (argparse then names the commands), and a path is not a host."""
    import difflib

    near = difflib.get_close_matches(word, list(_command_modules()), n=1, cutoff=0.75)
    return "/" not in word and not near


def main(argv: list[str] | None = None) -> int:
    from nnwatch.cli._clean_output import clean_output

    with clean_output():  # what comes from runs and hosts is shown, never obeyed by the terminal
        return _main(argv)


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, mods = build_parser()
    if not argv and DEFAULT_COMMAND in mods:
        argv = [DEFAULT_COMMAND]
    elif argv[0] not in mods and not argv[0].startswith("-") and _looks_like_host(argv[0]):
        argv = [DEFAULT_COMMAND, "--host", argv[0].rstrip(":"), *argv[1:]]  # `nnwatch HOST`
    args = parser.parse_args(argv)
    root = getattr(args, "root", None)
    if root is not None:  # --root: every lookup, and the commands this one starts, look there
        os.environ["NNWATCH_RUN_DIR"] = str(root)
    if not args.command:
        parser.print_help()
        return 2
    from nnwatch.cli._config import ConfigError

    try:
        return int(mods[args.command].run(args) or 0)
    except ConfigError as exc:
        print(f"nnwatch: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        print(
            f"nnwatch {args.command}: this needs PyTorch, and this Python ({sys.executable}) has "
            "none: install the torch your training uses here (pip install torch). Watching runs "
            "(ls, attach, open, pull, show) works without it.",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
