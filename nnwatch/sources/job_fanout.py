"""Every rank of a multi-node job through the user's own OpenSSH: ``attach --job JOB --hosts H``.

Touches nothing in the trainer. For each host, one multiplexed connection (``ssh -M -S PATH -N``,
ControlMaster, in a private 0700 directory this module creates and always removes) carries one
long-running ``nnwatch ranks JOB --json --follow`` there, which prints the host's ranks of the
job once a second; opening one rank's full dashboard later goes through the same connection. The
rows of all hosts are grouped by the job identity the ranks recorded (``TORCHELASTIC_RUN_ID``,
else master address and port, and the restart), judged together (who stopped first, who holds
the job: :func:`nnwatch.store.job_health.judge_job`) and turned into one :class:`JobView`.

A host that cannot be reached is shown as such, with ssh's own reason, and retried every few
seconds; it is never left out silently. Hosts come from a list (``a,b,c``), a hostfile (one host
a line; ``host slots=4`` and ``#`` comments as MPI writes them), or ``slurm``: the node list of
the Slurm job (``SLURM_JOB_NODELIST``, or the one a local rank recorded).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nnwatch.sources.base import SourceError
from nnwatch.sources.job_findings import job_findings, lag_limit
from nnwatch.sources.job_stacks import RankStacks
from nnwatch.sources.job_table import SeenRank
from nnwatch.sources.job_view import JobView, RankSummary
from nnwatch.sources.remote_command import explain_failure, remote_command
from nnwatch.sources.ssh_child import close_on_signals, closed, spawn_tied, stop_process
from nnwatch.store.job_health import certain_first, judge_job
from nnwatch.store.jobs import Job
from nnwatch.store.rank_end import HEARTBEAT_PERIOD, SILENT_SLACK
from nnwatch.store.schema import MAX_WORLD_SIZE, FieldName

CONNECT_TIMEOUT = 30.0
RETRY_S = 5.0
#: A host whose last line is older than this is shown as unreachable (its rows as last seen).
SILENT_S = 5.0
_FIELDS = set(RankSummary.__dataclass_fields__)
_LIVE = frozenset({"live", "running", "paused", "starting"})


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compact node list: ``gpu[01-03,07],cpu5`` -> gpu01 gpu02 gpu03 gpu07 cpu5."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?", text):
        prefix, ranges = m.group(1).strip(), m.group(2)
        if not prefix:
            continue
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if hi:
                width = len(lo)
                out += [f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
            elif lo:
                out.append(f"{prefix}{lo}")
    return out


def parse_hosts(spec: str, *, env: dict[str, str] | None = None) -> list[str]:
    """The hosts ``--hosts`` names: a comma list, a hostfile, or ``slurm``."""
    env = dict(os.environ) if env is None else env
    spec = spec.strip()
    if spec == "slurm":
        nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        if not nodes:
            raise SourceError("--hosts slurm: no SLURM_JOB_NODELIST here; name the hosts instead")
        return expand_nodelist(nodes)
    path = Path(spec.removeprefix("@")).expanduser()
    if spec.startswith("@") or (path.is_file() and "," not in spec):
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise SourceError(f"cannot read the hostfile {path}: {exc.strerror}") from None
        hosts = [ln.split("#", 1)[0].split()[0] for ln in lines if ln.split("#", 1)[0].strip()]
    else:
        hosts = [h.strip() for h in spec.split(",") if h.strip()]
    if not hosts:
        raise SourceError(f"--hosts {spec!r} names no host")
    return list(dict.fromkeys(hosts))


class HostLink:
    """One host: its ControlMaster, and ``nnwatch ranks --json --follow`` through it."""

    def __init__(self, host: str, index: int, workdir: Path, job: str, *, ssh: str = "ssh",
                 ssh_args: Sequence[str] = (), remote_nnwatch: str | None = None,
                 remote_root: str | None = None) -> None:  # fmt: skip
        self.host = host
        self.job = job
        self.base = [*shlex.split(ssh), *ssh_args]
        self.remote_nnwatch = remote_nnwatch
        self.remote_root = remote_root
        self.control = workdir / f"{index}.ctl"
        self.err = workdir / f"{index}.err"
        self.master: subprocess.Popen[bytes] | None = None
        self.follow: subprocess.Popen[str] | None = None
        self.latest: dict[str, Any] | None = None
        self.latest_at = 0.0
        #: job key -> the stacks this host last sent for its ranks of that job (while stuck)
        self.stacks: dict[str, list[dict[str, Any]]] = {}
        self.error = ""  # why the host cannot be reached, in ssh's own words
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._run, name=f"nnwatch-ssh-{host}", daemon=True)

    def ssh_command(self, *remote: str) -> list[str]:
        """An ssh command through this host's master connection (shared with the dashboard)."""
        return [*self.base, "-S", str(self.control), "-o", "ControlMaster=no", self.host, *remote]

    def _start_master(self) -> None:
        self.control.unlink(missing_ok=True)
        cmd = [*self.base, "-M", "-S", str(self.control), "-N", "-o", "ControlPersist=no",
               "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3", self.host]  # fmt: skip
        with open(self.err, "wb") as errf:
            try:
                self.master = spawn_tied(cmd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=errf)  # fmt: skip
            except FileNotFoundError:
                raise SourceError(f"cannot run {cmd[0]!r}: is OpenSSH installed here?") from None
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while not self.control.exists():
            if self.master.poll() is not None or time.monotonic() > deadline or self.closed:
                stop_process(self.master)
                text = self.err.read_text(errors="replace").strip().splitlines()
                raise SourceError(text[-1] if text else "ssh gave no reason")
            time.sleep(0.02)

    def _run(self) -> None:
        while not self.closed:
            try:
                if self.master is None or self.master.poll() is not None:
                    self._start_master()
                self._follow()
            except SourceError as exc:
                self.error = str(exc)
            except Exception as exc:  # noqa: BLE001 - this host's trouble never stops the others
                self.error = f"{type(exc).__name__}: {exc}"
            if not self.closed:
                time.sleep(RETRY_S)

    def _follow(self) -> None:
        cmd = self.ssh_command(
            remote_command(["ranks", self.job, "--json", "--follow"],
                           remote_nnwatch=self.remote_nnwatch, root=self.remote_root)  # fmt: skip
        )
        self.follow = spawn_tied(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, bufsize=1)  # fmt: skip
        assert self.follow.stdout is not None
        for line in self.follow.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.latest, self.latest_at, self.error = doc, time.time(), ""
                self._keep_stacks(doc)
        err = (self.follow.stderr.read() if self.follow.stderr else "").strip().splitlines()
        code = self.follow.wait()
        if not self.closed:
            why = explain_failure(self.host, code, "\n".join(err), self.remote_nnwatch)
            raise SourceError(f"`nnwatch ranks` on {self.host} ended: {why}")

    def _keep_stacks(self, doc: dict[str, Any]) -> None:
        """Stacks come once per answer, and go when the job moves again."""
        for job in doc.get("jobs") or []:
            key = _job_key(job)
            if isinstance(job.get("stacks"), list):
                self.stacks[key] = [s for s in job["stacks"] if isinstance(s, dict)]
            elif not job.get("stuck"):
                self.stacks.pop(key, None)

    def close(self) -> None:
        self.closed = True
        stop_process(self.follow)
        stop_process(self.master)
        self.control.unlink(missing_ok=True)


class JobFanout:
    """Follows one job on every host; :meth:`poll` merges what each host last said."""

    def __init__(self, job: str, hosts: Sequence[str], *, ssh: str = "ssh",
                 ssh_args: Sequence[str] = (), remote_nnwatch: str | None = None,
                 options_for: Callable[[str], dict[str, Any]] | None = None) -> None:  # fmt: skip
        """``options_for(host)``: how to reach each host (``ssh``, ``ssh_args``,
        ``remote_nnwatch``, ``remote_root``: the config file's table for it under the flags);
        without it every host is reached with ``ssh``, ``ssh_args`` and ``remote_nnwatch``."""
        self.spec = job
        self.dir = Path(tempfile.mkdtemp(prefix="nnwj-", dir="/tmp"))  # short: socket paths
        os.chmod(self.dir, 0o700)

        def make_link(host: str, i: int) -> HostLink:
            if options_for is None:
                return HostLink(host, i, self.dir, job, ssh=ssh, ssh_args=ssh_args,
                                remote_nnwatch=remote_nnwatch)  # fmt: skip
            o = options_for(host)
            return HostLink(host, i, self.dir, job, ssh=o["ssh"], ssh_args=o["ssh_args"],
                            remote_nnwatch=o["remote_nnwatch"], remote_root=o["remote_root"])  # fmt: skip

        self.links = [make_link(h, i) for i, h in enumerate(hosts)]
        self.job: Job | None = None
        #: rank -> (the ssh host it was reached through, its run directory there)
        self.where: dict[int, tuple[str, str]] = {}
        #: the rank(s) seen stopped while every other rank still lived: the first, for certain,
        #: kept for the rest of the view (the launcher's teardown blurs the files' story)
        self._first_seen: tuple[int, ...] = ()
        self._key = ""
        atexit.register(self.close)
        close_on_signals(self)  # a closed terminal removes the control sockets' directory too
        for link in self.links:
            link.thread.start()

    def link_for(self, host: str) -> HostLink | None:
        return next((x for x in self.links if x.host == host), None)

    def poll(self) -> JobView | None:
        """The whole job as the hosts last reported it; None before any host answered."""
        now = time.time()
        groups, events, world, label = self._gather()
        unreachable = self._unreachable(now)
        if not groups:
            if not unreachable:
                return None
            job = Job(f"ssh:{self.spec}", self.spec, "unknown", max(world, 1), 0, ())
            return JobView(job, (), (), (), (), unreachable=tuple(unreachable), via="ssh")
        # the newest restart of the job with the most ranks reporting
        key = max(groups, key=lambda k: (len(groups[k]), k))
        if self._key != key:  # another job, or a restart of it: what was seen was of the old one
            self._first_seen, self._key = (), key
        pairs = sorted(groups[key], key=lambda p: int(p[1].get("rank", 0)))
        stale_hosts = {h for h, _ in unreachable}
        cross = events.get(key, [])
        rows, seen = _rank_rows(pairs, stale_hosts)
        have = {r.rank for r in rows}
        missing = tuple(r for r in range(world) if r not in have)
        stops = judge_job(seen, now=now, known_first=self._first_seen, missing=missing)
        if not self._first_seen and self._settled(stops, [link for link, _ in pairs]):
            self._first_seen = certain_first(seen, stops)
        live = [r.step for r in rows if r.step is not None and r.state in _LIVE and r.reachable]
        lead = max(live) if live else None
        self.where = {int(r["rank"]): (link.host, str(r.get("run_dir") or "")) for link, r in pairs}
        limit = lag_limit(r.steps_per_s for r in rows if r.state in _LIVE)
        rows = [_told(row, stops, lead, limit) for row in rows]
        origin = _nan_origin(rows, world)
        job = Job(key, label, "ssh", max(world, len(rows)), 0, ())
        self.job = job
        found = job_findings(rows, nan_origin=origin, stops=stops, cross_rank=cross)
        stragglers = tuple(r.rank for r in rows if r.status == "behind")
        stacks = self._stacks(key)
        return JobView(job, tuple(rows), origin, stragglers, tuple(cross), stops, found,
                       unreachable=tuple(unreachable), via="ssh",
                       stacks=tuple(sorted(stacks, key=lambda st: st.rank)))  # fmt: skip

    def _gather(
        self,
    ) -> tuple[
        dict[str, list[tuple[HostLink, dict[str, Any]]]], dict[str, list[dict[str, Any]]], int, str
    ]:
        """What every host last said, grouped by job key: the (host, rank row) pairs, the
        cross-rank events, the largest world size any host reported, and the job's label."""
        groups: dict[str, list[tuple[HostLink, dict[str, Any]]]] = {}
        events: dict[str, list[dict[str, Any]]] = {}
        world = 0
        label = self.spec
        for link in self.links:
            with link.lock:
                doc = link.latest
            for job in (doc or {}).get("jobs", []):
                key = _job_key(job)
                groups.setdefault(key, []).extend((link, r) for r in job.get("rows", []))
                events.setdefault(key, []).extend(
                    e for e in job.get("events", []) if isinstance(e, dict)
                )
                world = max(world, min(int(job.get("world_size") or 0), MAX_WORLD_SIZE))
                label = str(job.get("label") or label).split(" (")[0]
        return groups, events, world, label

    def _unreachable(self, now: float) -> list[tuple[str, str]]:
        """(host, why) for every host that has not answered lately: shown, never left out."""
        unreachable = []
        for link in self.links:
            stale = link.latest is None or now - link.latest_at > SILENT_S
            if stale:
                why = link.error or ("connecting…" if link.latest is None else
                                     f"no answer for {now - link.latest_at:.0f} s")  # fmt: skip
                unreachable.append((link.host, why))
        return unreachable

    def _stacks(self, key: str) -> list[RankStacks]:
        """The stacks every host holds for job ``key``, each named by the host its rank was
        reached through."""
        stacks = []
        for link in self.links:
            with link.lock:
                stacks += [RankStacks.from_dict(d) for d in link.stacks.get(key, [])]
        return [dataclasses.replace(st, host=self._host_of(st.rank) or st.host) for st in stacks]

    def _host_of(self, rank: int) -> str:
        return self.where.get(rank, ("", ""))[0]

    @staticmethod
    def _settled(stops: Any, links: list[HostLink]) -> bool:
        """Whether "the others still lived" can be trusted of this poll: the first stop is one of
        its own (not a failed collective or a termination, which follow another rank's), and
        every host reported after it (hosts report once a second, not at the same moment: a
        late one may still call alive a rank that died before the first stop)."""
        first = stops.ranks.get(stops.first[0]) if stops.first else None
        if first is None or first.how in ("collective failed", "terminated"):
            return False
        at = stops.first_at
        if at is None:
            return False
        if first.how == "killed":  # a silent death lies up to a heartbeat after its last beat
            at += HEARTBEAT_PERIOD + SILENT_SLACK
        return all(link.latest_at > at for link in links)

    def close(self) -> None:
        for link in self.links:
            link.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        closed(self)


def _job_key(job: dict[str, Any]) -> str:
    """One job's key across hosts: the identity its ranks recorded, and the restart."""
    ident = job.get("ident") or {}
    return f"{ident.get('id') or job.get('key')}#{ident.get('restart') or 0}"


def _rank_rows(
    pairs: list[tuple[HostLink, dict[str, Any]]], stale_hosts: set[str]
) -> tuple[list[RankSummary], list[SeenRank]]:
    """Each rank's row as a summary (named by the host the user reached it by, marked when that
    host is silent) and as what judging the whole job needs of it."""
    rows, seen = [], []
    for link, r in pairs:
        d = {k: v for k, v in r.items() if k in _FIELDS}
        for k in (FieldName.LOSS, FieldName.GRAD_NORM, FieldName.STEP_TIME, "memory"):
            d[k] = float("nan") if d.get(k) is None else float(d[k])
        if "host" in _FIELDS:  # the name the user reached it by: every node may be `vm`
            d["host"] = link.host
        d["reachable"] = link.host not in stale_hosts
        if not d["reachable"]:
            d["status"], d["note"] = "unreachable", f"as last seen over ssh ({link.host})"
        rows.append(RankSummary(**d))
        seen.append(SeenRank(int(r["rank"]), str(r.get("state") or ""), r.get("step"),
                          r.get("heartbeat_at"), r.get("last_step_at"), r.get("step_interval"),
                          r.get("ending"), r.get("alive"), None, r.get("seen_first_at")))  # fmt: skip
    return rows, seen


def _nan_origin(rows: list[RankSummary], world: int) -> tuple[int, ...]:
    """The rank(s) whose forward (else backward) pass went non-finite first; none unless every
    rank of the job is seen, since "first" is claimed over the whole job only."""
    fwd = [(r.forward_nonfinite_step, r.rank) for r in rows if r.forward_nonfinite_step is not None]
    pool = fwd or [(r.nonfinite_step, r.rank) for r in rows if r.nonfinite_step is not None]
    origin = tuple(sorted(rk for s, rk in pool if s == min(pool)[0])) if pool else ()
    if len(rows) < world or not all(r.reachable for r in rows):
        origin = ()  # "first" is claimed over the whole job only, never over the ranks seen
    return origin


def _told(row: RankSummary, stops: Any, lead: int | None, limit: int) -> RankSummary:
    """The row with its lag behind the job's leading rank (on any host) and what judging the
    whole job said of it (first to stop, waiting, ...)."""
    behind = (
        lead - row.step if lead is not None and row.step is not None and row.state in _LIVE else 0
    )
    row = dataclasses.replace(row, behind=max(0, behind))
    if row.status == "live" and behind >= limit:
        row = dataclasses.replace(
            row, status="behind", note=f"{behind} steps behind the leading rank"
        )
    told = stops.ranks.get(row.rank)
    if told is None or not row.reachable:
        return row
    return dataclasses.replace(row, status=told.status, note=told.words, role=told.role)
