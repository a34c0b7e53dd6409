"""``nnwatch ctl RUN COMMAND [ARG]``: steer a run from a shell or a script.

RUN is what ``nnwatch ls`` shows (a run name or its start, a pid, a run directory); ``HOST:RUN``
steers a run on another machine through the user's own ssh (its socket forwarded for as long as
the command runs, as ``attach HOST:RUN`` does), or give ``--connect SOCKET`` for a socket
forwarded by hand with ``ssh -L``. Each command is applied by the training
thread at its next step boundary; the answer says at which step. ``pause`` holds the run until
this command exits (Ctrl-C) or ``--for SECONDS`` passes: a pause always lifts itself when the
connection that asked for it closes, so a lost shell cannot leave training paused.

Exit status: 0 applied, 1 refused or unreachable, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

COMMAND = "ctl"
HELP = "send a command to a run: snapshot, pause, resume, set_clip N, set_layer_interval N, ..."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.channel.commands import COMMANDS

    lines = []
    for name, spec in COMMANDS.items():
        if spec.not_for_ctl:
            continue
        where = "" if spec.applied_by_trainer else " (answered at once)"
        lines.append(f"  {spec.usage(name):<24} {spec.summary}{where}")
        if spec.positional is not None and spec.args[spec.positional].help:
            arg = spec.args[spec.positional]
            lines.append(f"  {'':<24}   {arg.metavar}: {arg.help}")
    parser.epilog = (
        "commands (the training thread applies them at its next step boundary):\n"
        + "\n".join(lines)
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.usage = (
        "nnwatch ctl [options] RUN COMMAND [ARG]\n"
        "       nnwatch ctl [options] HOST:RUN COMMAND [ARG]\n"
        "       nnwatch ctl [options] --connect SOCKET COMMAND [ARG]"
    )
    parser.add_argument(
        "words", nargs="+", metavar="RUN COMMAND [ARG]",
        help="which run (HOST:RUN for one on another host), what to do, its argument",
    )  # fmt: skip
    from nnwatch.cli._options import SECONDS, add_connect_argument, add_root_argument

    add_connect_argument(parser, "send the command")
    add_root_argument(parser)
    parser.add_argument(
        "--rank", type=int, default=None, metavar="N", help="the rank, when RUN has several"
    )
    parser.add_argument(
        "--all-ranks", action="store_true", help="send the command to every rank of RUN"
    )
    parser.add_argument("--json", action="store_true", help="print the replies as JSON")
    parser.add_argument(
        "--timeout", type=float, default=10.0, metavar=SECONDS,
        help="how long to wait for a reply (default 10)",
    )  # fmt: skip
    parser.add_argument(
        "--for",
        dest="hold",
        type=float,
        default=None,
        metavar=SECONDS,
        help="pause: resume after this long instead of waiting for Ctrl-C",
    )
    from nnwatch.cli.attach import add_ssh_arguments

    add_ssh_arguments(parser, "for HOST:RUN, ")


def _parse_arg(command: str, text: str | None) -> dict[str, Any]:
    """Turn the positional ARG into the command's argument, with plain-words errors."""
    from nnwatch.channel.commands import COMMANDS, CommandError

    spec = COMMANDS.get(command)
    if spec is None:
        known = ", ".join(n for n, s in COMMANDS.items() if not s.not_for_ctl)
        raise CommandError(f"unknown command {command!r}; known commands: {known}")
    if spec.not_for_ctl:
        raise CommandError(spec.not_for_ctl)
    return spec.from_text(command, text)


def _targets(args: argparse.Namespace, spec: str | None) -> list[tuple[str, Path]]:
    """(label, socket path) of every run the command goes to."""
    from nnwatch.store.registry import find_runs

    if args.connect:
        return [(args.connect, Path(args.connect).expanduser())]
    assert spec is not None
    runs = find_runs(spec)
    if not runs:
        raise LookupError(f"no registered run matches {spec!r}; `nnwatch ls` lists the runs")
    if args.rank is not None:
        runs = [r for r in runs if r.rank == args.rank]
        if not runs:
            raise LookupError(f"{spec!r} has no rank {args.rank}")
    if len(runs) > 1 and not args.all_ranks:
        shown = ", ".join(f"{Path(r.run_dir).name} (pid {r.pid}, rank {r.rank})" for r in runs)
        what = "several ranks" if len({r.name for r in runs}) == 1 else "several runs"
        raise LookupError(
            f"{spec!r} matches {what}: {shown}; add --rank N or --all-ranks, or name one run"
        )
    out = []
    for r in runs:
        if not r.live:
            raise LookupError(
                f"{Path(r.run_dir).name} is {r.state} ({r.message}); nothing to steer"
            )
        if not r.socket:
            raise LookupError(f"{Path(r.run_dir).name} has no command socket")
        out.append((f"{Path(r.run_dir).name} rank {r.rank}", Path(r.socket)))
    return out


def _remote_target(args: argparse.Namespace, spec: str) -> tuple[str, Path, Any] | None:
    """``HOST:RUN`` when no run here matches it: (label, a private local socket forwarded to
    the run's socket there, the tunnel to close); None when ``spec`` names no host."""
    from nnwatch.cli.attach import remote_spec, ssh_options
    from nnwatch.sources.remote import SshTunnel, pick_run, remote_runs
    from nnwatch.store.registry import find_runs

    remote = remote_spec(spec)
    if remote is None or find_runs(spec):
        return None
    if args.all_ranks:
        raise LookupError("--all-ranks works on this machine's runs; name one rank of HOST:RUN")
    host, run_spec = remote
    opts = ssh_options(args, host)
    rows = remote_runs(
        host, ssh=opts["ssh"], ssh_args=opts["ssh_args"], remote_nnwatch=opts["remote_nnwatch"],
        remote_root=opts["remote_root"],
    )  # fmt: skip
    if args.rank is not None:
        run_spec = f"{run_spec}:{args.rank}"
    info = pick_run(rows, run_spec, host)
    tunnel = SshTunnel(host, str(info["socket"]), ssh=opts["ssh"], ssh_args=opts["ssh_args"])
    try:
        tunnel.start()
    except BaseException:
        tunnel.close()
        raise
    label = f"{host}:{Path(str(info.get('run_dir') or '')).name} rank {info.get('rank', 0)}"
    return label, tunnel.local, tunnel


def run(args: argparse.Namespace) -> int:
    from nnwatch.channel.commands import CommandError, validate
    from nnwatch.sources.base import SourceError

    words = list(args.words)
    need = 1 if args.connect else 2
    if len(words) < need or len(words) > need + 1:
        usage = "COMMAND [ARG]" if args.connect else "RUN COMMAND [ARG]"
        print(f"nnwatch ctl: expected {usage}, got {' '.join(words)!r}", file=sys.stderr)
        return 2
    spec = None if args.connect else words.pop(0)
    command = words[0]
    try:
        cmd_args = _parse_arg(command, words[1] if len(words) > 1 else None)
        validate(command, cmd_args)  # the server's own rules, checked before connecting
        far = None if spec is None else _remote_target(args, spec)
        targets = [far[:2]] if far is not None else _targets(args, spec)
    except CommandError as exc:
        print(f"nnwatch ctl: {exc.message}", file=sys.stderr)
        return 2
    except (LookupError, SourceError) as exc:
        print(f"nnwatch ctl: {exc.args[0]}", file=sys.stderr)
        return 1
    try:
        return _send(args, command, cmd_args, targets)
    finally:
        if far is not None:
            far[2].close()  # the forwarded socket goes; a pause it held lifts


def _send(
    args: argparse.Namespace, command: str, cmd_args: dict[str, Any], targets: list[Any]
) -> int:
    """Send ``command`` to every target, report the replies, hold a pause while asked to."""
    from nnwatch.channel.commands import PAUSE
    from nnwatch.channel.pause import KeptConnection

    conns: list[KeptConnection] = []
    status = 0
    results = []
    try:
        for label, path in targets:
            conn = KeptConnection(path, timeout=args.timeout)
            conns.append(conn)
            reply = conn.send(command, cmd_args)
            results.append(
                {
                    "run": label, "command": command, "ok": reply.ok,
                    "applies_at_step": reply.applies_at_step, "error": reply.error,
                    "data": reply.data,
                }
            )  # fmt: skip
            if not reply.ok:
                status = 1
        _report(results, command, as_json=args.json)
        if command == PAUSE and status == 0:
            status = _hold_pause(conns, args.hold, quiet=args.json)
    finally:
        for conn in conns:
            conn.close()
    return status


#: What a server-answered reply (hello) shows first, when it has it.
_SHOWN = ("name", "pid", "host", "rank", "world_size", "run_dir", "ring", "socket")


def _report(results: list[dict[str, Any]], command: str, *, as_json: bool) -> None:
    if as_json:
        json.dump(results, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return
    for r in results:
        prefix = f"{r['run']}: " if len(results) > 1 else ""
        if not r["ok"]:
            print(f"{prefix}{command} failed: {r['error']}", file=sys.stderr)
        elif isinstance(r.get("data", {}).get("threads"), list):  # stacks
            from nnwatch.channel.stacks import format_thread

            for thread in r["data"]["threads"]:
                print("\n".join(prefix + line for line in format_thread(thread, "")))
        elif r.get("applies_at_step") is None and r.get("data"):  # answered by the server
            data = r["data"]
            shown = [k for k in _SHOWN if k in data] or [
                k for k, v in data.items() if isinstance(v, (str, int, float))
            ]
            for key in shown:
                print(f"{prefix}{key:<11} {data[key]}")
        elif r.get("applies_at_step") is not None:
            print(f"{prefix}{command} applies at step {r['applies_at_step']}")
        else:
            print(f"{prefix}{command}: done")
    sys.stdout.flush()


def _hold_pause(conns: list[Any], hold: float | None, *, quiet: bool) -> int:
    """Hold the pause (each connection renews its own) until Ctrl-C, SIGTERM or ``hold``
    seconds, then resume; 1 when the run lifted the pause first (resumed elsewhere, or gone)."""
    from nnwatch.channel.commands import RESUME
    from nnwatch.channel.pause import hold_until

    if not quiet:
        until = f"for {hold:g} s" if hold is not None else "until Ctrl-C"
        print(f"holding the pause {until}; it lifts when this command exits", flush=True)
    done = {"stop": False}

    def on_term(signum: int, frame: Any) -> None:
        done["stop"] = True

    old = signal.signal(signal.SIGTERM, on_term)
    deadline = None if hold is None else time.monotonic() + hold
    lost = ""
    try:
        lost = hold_until(conns, lambda: done["stop"] or (
            deadline is not None and time.monotonic() >= deadline))  # fmt: skip
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
    if lost:
        print(f"nnwatch ctl: the pause ended without this command: {lost}", file=sys.stderr)
        return 1
    for conn in conns:
        conn.send(RESUME)  # closing the connection lifts the pause anyway
    if not quiet:
        print("resumed", flush=True)
    return 0
