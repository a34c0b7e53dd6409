"""``nnwatch ls HOST [HOST ...]``: the runs on other machines, through the user's own ssh.

Kept apart from ``ls.py`` (which calls it) so that listing here and listing there grow apart.
Each host is asked at once, in parallel, for ``nnwatch ls --json`` (``--all`` passed on); a host
that cannot be reached is named on stderr with ssh's own reason and the others are still listed.
Every run is shown under the name the user gave its host (nodes that all call themselves ``vm``
stay apart). The ranks of one job are grouped by the job identity they recorded, whichever host
they are on, and the job's story (who stopped first, who was a victim, who waits for whom) is
judged over all of them together: a rank on node01 whose collective failed because a rank on
node02 was killed is a victim, and the killed rank is named first.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def _fetch(args: argparse.Namespace, host: str) -> tuple[str, list[dict[str, Any]], str]:
    from nnwatch.cli._config import ssh_options_for
    from nnwatch.sources.base import SourceError
    from nnwatch.sources.remote import remote_runs

    try:
        rows = remote_runs(host, finished=bool(args.all), **ssh_options_for(args, host))
    except SourceError as exc:
        return host, [], str(exc)
    return host, rows, ""


def _info(row: dict[str, Any], host: str) -> Any:
    """A ``RunInfo`` from a row of ``ls --json`` on ``host``: the host as the user named it, the
    run directory prefixed by it (two nodes may hold the same path)."""
    from nnwatch.store.registry import RunInfo

    names = {f.name for f in dataclasses.fields(RunInfo)}
    kept = {k: v for k, v in row.items() if k in names}
    kept.update(host=host, run_dir=f"{host}:{row.get('run_dir', '')}")
    return RunInfo(**kept)


def _jobs(pairs: list[tuple[Any, dict[str, Any]]]) -> tuple[dict[str, Any], dict[int, Any]]:
    """Each run's job (by its prefixed run directory), each job judged over every host."""
    from nnwatch.store.job_health import judge_job
    from nnwatch.store.jobs import Job

    groups: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for info, row in pairs:
        job = row.get("job") if isinstance(row.get("job"), dict) else None
        key = str(job["key"]) if job and job.get("key") else f"run:{info.run_dir}"
        groups.setdefault(key, []).append((info, row))
    job_of: dict[str, Any] = {}
    stops: dict[int, Any] = {}
    for key, members in groups.items():
        first = members[0][1].get("job") or {}
        by_rank = {info.rank: info for info, _ in members}  # a rank twice: the last host's
        runs = tuple(by_rank[r] for r in sorted(by_rank))
        world = max([int(first.get("world_size") or 1), *(r.world_size for r in runs)])
        name = str(first.get("label") or runs[0].name).split(" (")[0]
        hosts = sorted({r.host for r in runs})
        label = f"{name} ({len(runs)}/{world} ranks on {', '.join(hosts)})" if world > 1 else name
        job = Job(key, label, str(first.get("source") or "single"), world,
                  int(first.get("restart") or 0), runs)  # fmt: skip
        for info in runs:
            job_of[info.run_dir] = job
        if job.distributed:
            stops[id(job)] = judge_job(list(runs), missing=job.missing)
    return job_of, stops


def remote_listing(
    args: argparse.Namespace,
) -> tuple[list[Any], tuple[dict[str, Any], dict[int, Any]], int]:
    """The runs on ``args.hosts`` (see the module docstring), their jobs judged over every host
    (``ls``'s ``judged`` pair), and how many hosts could not be reached (named on stderr)."""
    with ThreadPoolExecutor(max_workers=min(16, len(args.hosts))) as pool:
        answers = list(pool.map(lambda h: _fetch(args, h), args.hosts))
    pairs: list[tuple[Any, dict[str, Any]]] = []
    failed = 0
    for host, rows, error in answers:
        if error:
            failed += 1
            print(f"nnwatch ls: {host}: {error}", file=sys.stderr)
        pairs += [(_info(r, host), r) for r in rows]
    pairs.sort(key=lambda p: (p[0].started, p[0].host, p[0].rank))
    return [info for info, _ in pairs], _jobs(pairs), failed
