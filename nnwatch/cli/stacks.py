"""``nnwatch stacks JOB [--hosts HOSTS]``: where every rank of a job is, right now.

Every rank's Python stacks (all threads), asked of all its ranks at once through their command
sockets and answered by nnwatch's own thread in each rank, so a rank blocked in a collective (or
anywhere in C that releases the GIL) still answers with the line it waits on. Identical stacks
are folded together ("ranks 0-62 · all_reduce (...)"), ranks that do not answer are named. It is
what people otherwise do by hand with ``py-spy dump`` on every node.

JOB is a job's name or torchrun run id (as ``nnwatch ls`` shows them), or one run's name or pid.
``--hosts node01,node02`` (or a hostfile, or ``slurm``) asks every node at once through the user's
own ssh, each running ``nnwatch stacks JOB --json`` there.

Exit status: 0 every rank answered, 1 some did not (or none was found), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

COMMAND = "stacks"
HELP = "every rank's Python stacks (all threads), asked of all ranks at once: where a job is stuck"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.cli._options import SECONDS, add_root_argument
    from nnwatch.cli.attach import add_ssh_arguments

    parser.add_argument("job", metavar="JOB", help="a job's name or run id, or a run's name or pid")
    parser.add_argument("--hosts", metavar="HOSTS",
                        help="ask the ranks on these hosts over ssh (a,b,c, a hostfile or 'slurm')")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the answers as JSON")
    parser.add_argument("--all-threads", action="store_true",
                        help="show nnwatch's own threads too")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1.5, metavar=SECONDS,
                        help="how long each rank gets to answer (default 1.5)")  # fmt: skip
    add_root_argument(parser)
    add_ssh_arguments(parser, "with --hosts, ")


def local_targets(spec: str) -> tuple[str, list[Any]]:
    """The live ranks ``spec`` names on this machine: (what they are, their targets)."""
    from nnwatch.cli.ranks import matches
    from nnwatch.sources.job_stacks import Target
    from nnwatch.store.jobs import group_jobs
    from nnwatch.store.registry import find_runs, list_runs

    runs = list_runs()
    jobs = [j for j in group_jobs(runs) if j.distributed and matches(j, spec)]
    if jobs:
        job = max(jobs, key=lambda j: max(r.started for r in j.runs))  # the newest of that name
        chosen, label = list(job.runs), f"job {job.label}"
    else:
        chosen = find_runs(spec)
        label = f"run {spec}"
    live = [r for r in chosen if r.socket and not r.ended and r.alive is not False]
    return label, [Target(r.rank, r.host, r.pid, str(r.socket)) for r in live]


def _remote(args: argparse.Namespace, host: str) -> tuple[str, list[Any], str]:
    """``nnwatch stacks JOB --json`` on ``host``: its answers, or why there are none."""
    import subprocess

    from nnwatch.cli._config import ssh_options_for
    from nnwatch.sources.job_stacks import RankStacks
    from nnwatch.sources.remote_command import explain_failure, remote_command
    from nnwatch.sources.ssh_child import ssh_base

    opts = ssh_options_for(args, host)
    words = ["stacks", args.job, "--json", "--timeout", f"{args.timeout:g}"]
    cmd = [*ssh_base(opts["ssh"], opts["ssh_args"]), host,
           remote_command(words, remote_nnwatch=opts["remote_nnwatch"], root=opts["remote_root"])]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30 + args.timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return host, [], f"ssh {host}: {exc}"
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return host, [], explain_failure(host, done.returncode, done.stderr, opts["remote_nnwatch"])
    ranks = [RankStacks.from_dict({**d, "host": host}) for d in doc.get("ranks") or []]
    return host, ranks, str(doc.get("error") or "")


def run(args: argparse.Namespace) -> int:
    from nnwatch.sources.job_stacks import describe, gather

    start = time.monotonic()
    errors: list[str] = []
    if args.hosts:
        from nnwatch.sources.base import SourceError
        from nnwatch.sources.job_fanout import parse_hosts

        try:
            hosts = parse_hosts(args.hosts)
        except SourceError as exc:
            print(f"nnwatch stacks: {exc}", file=sys.stderr)
            return 2
        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            answers = list(pool.map(lambda h: _remote(args, h), hosts))
        stacks = sorted((s for _, got, _ in answers for s in got), key=lambda s: s.rank)
        errors = [f"{h}: {e}" for h, _, e in answers if e]
        label = f"job {args.job} on {', '.join(hosts)}"
    else:
        label, targets = local_targets(args.job)
        stacks = gather(targets, timeout=args.timeout)
        if not targets:
            errors.append(f"no live run or job here matches {args.job!r} (`nnwatch ls` lists them)")
    elapsed = time.monotonic() - start
    if args.json:
        json.dump({"label": label, "host": socket.gethostname(), "elapsed": elapsed,
                   "ranks": [s.to_dict() for s in stacks], "error": "; ".join(errors)},
                  sys.stdout, default=str)  # fmt: skip
        sys.stdout.write("\n")
    else:
        for e in errors:
            print(f"nnwatch stacks: {e}", file=sys.stderr)
        if stacks:
            answered = sum(1 for s in stacks if not s.error)
            print(f"{label}: {answered} of {len(stacks)} ranks answered in {elapsed:.2f} s")
            print("\n".join(describe(stacks, own=args.all_threads)))
    return 0 if stacks and not errors and all(not s.error for s in stacks) else 1
