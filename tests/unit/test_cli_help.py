"""Every command's ``--help``, walked: each option says what it does, the same thing has the same
name everywhere, runs are looked up under ``--root`` wherever they are looked up, and the commands
nnwatch runs on another host over ssh stay out of the top-level help."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys

import pytest

from nnwatch.cli import _options, build_parser, main

#: Commands run on the far host by other commands, never typed by a user.
PLUMBING = {"pack", "ranks"}
#: Commands that find a run by name, pid or directory among the registered and recorded runs.
LOOK_UP_RUNS = {"attach", "open", "ctl", "ls", "gc", "pack", "pick", "serve", "ranks", "stacks"}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser, _ = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options_of(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if not isinstance(a, (argparse._HelpAction,))]


def _help_text(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0, argv
    return out.getvalue()


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_option_of_every_command_has_help(command: str) -> None:
    text = _help_text([command, "--help"])
    assert text.startswith("usage: nnwatch " + command)
    missing = [
        a.option_strings or [a.dest]
        for a in _options_of(_subparsers()[command])
        if not (a.help and a.help.strip()) or a.help == argparse.SUPPRESS
    ]
    assert not missing, f"`nnwatch {command}`: options without a help text: {missing}"


def test_the_same_option_has_the_same_metavar_in_every_command() -> None:
    seen: dict[str, dict[str, object]] = {}
    for command, p in _subparsers().items():
        for a in _options_of(p):
            for flag in a.option_strings:
                seen.setdefault(flag, {})[command] = a.metavar
    differ = {flag: by for flag, by in seen.items() if len({str(m) for m in by.values()}) > 1}
    assert not differ, f"one option, several names for its value: {differ}"


def test_one_word_for_each_thing() -> None:
    """A snapshot is SNAPSHOT_DIR, a model factory MODULE:FACTORY, a socket SOCKET, a root ROOT."""
    words: dict[tuple[str, str], object] = {}
    for command, p in _subparsers().items():
        for a in _options_of(p):
            words[(command, a.option_strings[0] if a.option_strings else a.dest)] = a.metavar
    for command in ("show", "replay"):
        assert words[(command, "snapshot")] == _options.SNAPSHOT_DIR
        assert words[(command, "--model")] == _options.FACTORY
    for command in ("attach", "ctl"):
        assert words[(command, "--connect")] == _options.SOCKET
    for (command, name), metavar in words.items():
        if name == "--root":
            assert metavar == _options.ROOT, command
        if name in ("--interval", "--timeout", "--for", "--hung-after"):
            assert metavar == _options.SECONDS, (command, name)


def test_runs_are_looked_up_under_root_wherever_they_are_looked_up() -> None:
    subs = _subparsers()
    lacking = [
        c
        for c in sorted(LOOK_UP_RUNS)
        if not any("--root" in a.option_strings for a in _options_of(subs[c]))
    ]
    assert not lacking, f"no --root on: {lacking}"


def test_plumbing_commands_are_hidden_from_the_top_level_help_but_still_answer() -> None:
    top = _help_text(["--help"])
    listed = {line.split()[0] for line in top.splitlines() if line.startswith("    ")}
    assert PLUMBING.isdisjoint(listed), listed
    assert {"attach", "ls", "open", "pull", "ctl", "show"} <= listed
    for command in PLUMBING:
        assert _help_text([command, "--help"]).startswith(f"usage: nnwatch {command}")


def test_walking_every_help_imports_neither_torch_nor_a_ui_library() -> None:
    """A laptop without torch reads every help page; nothing on the way needs torch."""
    code = (
        "import sys, contextlib, io\n"
        "from nnwatch.cli import main\n"
        f"for c in {sorted(_subparsers())!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try: main([c, '--help'])\n"
        "        except SystemExit: pass\n"
        "print(sorted(m for m in ('torch', 'textual') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch" not in done.stdout, done.stdout
