"""``nnwatch ranks [JOB] --json [--follow]``: this machine's ranks of a job, one JSON line a poll.

What ``nnwatch attach --job JOB --hosts HOSTS`` runs on every host over ssh (one multiplexed
connection per host): each line holds, for every job here whose name or run id starts with JOB,
one row per local rank (step, steps/s, loss, grad norm, memory, status) and the facts the
monitor needs to judge the whole job across hosts (heartbeat, last step, ending, pid alive);
while the job is stuck, every local rank's Python stacks (``stacks``, each answer sent once, and
``stuck``), asked through their sockets every few seconds.
Without ``--json`` it prints the same as a table, once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import socket
import sys
import time
from typing import Any

COMMAND = "ranks"
HIDDEN = True  # run on each host by `attach --job` over ssh
HELP = "this machine's ranks of a distributed job (what `attach --job` reads over ssh)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nnwatch.cli._options import SECONDS, add_root_argument

    parser.add_argument("job", nargs="?", default="", metavar="JOB",
                        help="job name or torchrun run id (or their start); default: every job")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON line per poll")
    parser.add_argument("--follow", action="store_true", help="keep printing, once per --interval")
    parser.add_argument("--interval", type=float, default=1.0, metavar=SECONDS,
                        help="with --follow: how often to look at the ranks (default 1)")  # fmt: skip
    add_root_argument(parser)


def matches(job: Any, spec: str) -> bool:
    """A job whose name, run id or master starts with ``spec`` (everything for an empty spec)."""
    if not job.distributed:
        return False
    if not spec:
        return True
    from nnwatch.store.jobs import read_job

    first = job.runs[0]
    ident = read_job(first.run_dir) or {}
    words = [first.name, str(ident.get("id", "")).split(":", 1)[-1], str(ident.get("master", "")),
             str(ident.get("id", ""))]  # fmt: skip
    return any(w and w.startswith(spec) for w in words)


def _facts(info: Any) -> dict[str, Any]:
    return {
        "state": info.state, "heartbeat_at": info.heartbeat_at, "last_step_at": info.last_step_at,
        "step_interval": info.step_interval, "ending": info.ending, "alive": info.alive,
        "seen_first_at": getattr(info, "seen_first_at", None), "run_dir": info.run_dir,
        "name": info.name, "socket": info.socket,
    }  # fmt: skip


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else x
    return x


#: How often the follower looks for ranks that ended before it started (no registry entry).
RESCAN_ENDED_S = 5.0


def _over(job: Any) -> bool:
    """Every rank of the job here has ended (or its process is gone)."""
    return all(r.ended or r.alive is False for r in job.runs)


class _Follower:
    """The local jobs matching a spec, each followed by a JobMonitor, regrouped every poll.

    A rank that ends (a SIGTERM from torchrun tearing the job down, an exception, a clean finish)
    removes its registry entry; it is still a rank of the job, so the runs once followed are
    remembered and judged from their directories, and so are the job's ranks that had ended here
    before the first poll, even when none of them is registered any more: the story of who
    stopped first survives the teardown. Of the jobs that are over, only the newest matching one
    is shown (a name is reused by every run of a script)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.monitors: dict[str, Any] = {}
        self.known: dict[str, Any] = {}  # run directory -> RunInfo of every rank followed
        self._ended: dict[str, Any] = {}  # run directory -> RunInfo, unregistered ranks
        self._ended_at = -RESCAN_ENDED_S
        self._stacks_sent: dict[str, float] = {}  # job key -> when the stacks sent were asked

    def _runs(self) -> list[Any]:
        from nnwatch.store.registry import list_runs, refresh

        runs = list_runs()
        listed = {r.run_dir for r in runs}
        for run_dir, info in list(self.known.items()):
            if run_dir not in listed:
                try:
                    runs.append(refresh(info))
                except Exception:  # noqa: BLE001 - a rank that cannot be read is kept as it was
                    runs.append(info)
        if time.monotonic() - self._ended_at >= RESCAN_ENDED_S:
            self._ended_at = time.monotonic()
            self._scan_ended({r.run_dir for r in runs})
        listed = {r.run_dir for r in runs}
        runs += [r for r in self._ended.values() if r.run_dir not in listed]
        return runs

    def _scan_ended(self, registered: set[str]) -> None:
        """Ranks of distributed jobs with no registry entry: each run directory is judged once
        (a host keeps many old runs); those of a followed job are judged again on every poll."""
        from nnwatch.store.paths import default_root
        from nnwatch.store.registry import inspect_dir

        root = default_root()
        try:
            found = {str(p.parent) for p in (*root.glob("runs/*/meta.json"), *root.glob("*/meta.json"))}
        except OSError:
            return
        for run_dir in sorted(found - set(self._ended) - registered):
            try:
                info = inspect_dir(run_dir)
            except Exception:  # noqa: BLE001 - one damaged run must not hide the others
                info = None
            if info is not None and info.world_size > 1:
                self._ended[run_dir] = info
        for gone in set(self._ended) - found:
            del self._ended[gone]

    def _jobs(self) -> list[Any]:
        from nnwatch.store.jobs import group_jobs

        jobs = [j for j in group_jobs(self._runs()) if matches(j, self.spec)]
        going = [j for j in jobs if not _over(j)]
        over = [j for j in jobs if _over(j)]
        newest = max(over, key=lambda j: max(r.started for r in j.runs), default=None)
        return going + ([newest] if newest is not None and not going else [])

    def poll(self) -> dict[str, Any]:
        from nnwatch.sources.job_monitor import JobMonitor
        from nnwatch.store.jobs import read_job
        from nnwatch.store.registry import refresh

        jobs = self._jobs()
        for job in jobs:
            self.known.update({r.run_dir: r for r in job.runs})
        out = []
        for job in jobs:
            mon = self.monitors.get(job.key)
            if mon is None or mon.job.ranks != job.ranks:
                if mon is not None:
                    mon.close()
                mon = self.monitors[job.key] = JobMonitor(job, use_summary=False)  # files only
            view = mon.poll()
            facts = {}
            for info in job.runs:
                try:
                    facts[info.rank] = _facts(refresh(info))
                except Exception:  # noqa: BLE001 - an unreadable rank keeps what was read
                    facts[info.rank] = _facts(info)
            rows = []
            for row in view.rows:
                d = {k: _clean(v) for k, v in dataclasses.asdict(row).items()}
                d.update(facts.get(row.rank, {}))
                rows.append(d)
            entry = {"key": job.key, "label": job.label, "world_size": job.world_size,
                     "ident": read_job(job.runs[0].run_dir), "rows": rows,
                     "events": [dict(e) for e in view.cross_rank_findings][-20:],
                     "stuck": bool(view.stacks)}  # fmt: skip
            asked = mon.stack_watch.asked_at
            if view.stacks and self._stacks_sent.get(job.key) != asked:  # each answer once
                self._stacks_sent[job.key] = asked
                entry["stacks"] = [st.to_dict() for st in view.stacks]
            out.append(entry)
        return {"host": socket.gethostname(), "time": time.time(), "jobs": out}


def run(args: argparse.Namespace) -> int:
    follower = _Follower(args.job)
    try:
        while True:
            doc = follower.poll()
            if args.json:
                sys.stdout.write(json.dumps(doc, default=str) + "\n")
            else:
                for job in doc["jobs"]:
                    print(job["label"])
                    for r in job["rows"]:
                        print(f"  rank {r['rank']:>4} {r['host']:<16} step {r['step']} {r['status']}")
            sys.stdout.flush()
            if not args.follow:
                return 0
            time.sleep(max(0.05, args.interval))
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
