"""The registry: how a monitor finds every run of its user without being told where to look.

Each live run (one per rank) writes one small JSON entry (:mod:`nnwatch.store.registry_entry`:
its path, its fields, the check every reader makes), atomically, into
``<root>/registry/<host>-<pid>-r<rank>.json``: who it is (pid and process start time, host,
command line, cwd, rank, local rank, world size, CUDA device UUIDs, nnwatch version), where its
files are (run directory, ring, command socket) and its layer names. The entry is removed at a
clean close; a crash leaves it behind, which is how ``nnwatch ls`` can report "crashed".

Liveness never trusts the entry alone: the pid must exist *with the same start time* (pids are
reused) and the ring's heartbeat must be fresh. ``gc()`` (:mod:`nnwatch.store.registry_gc`) removes the
entries, and the sockets, of processes that are gone.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nnwatch.store.clean_text import loads
from nnwatch.store.copy_note import describe_copy, read_copy_note
from nnwatch.store.exit_note import read_exit_note
from nnwatch.store.health import (
    HEARTBEAT_STALE,
    Health,
    Liveness,
    end_message,
    ended_as,
    gone_message,
    read_end,
)
from nnwatch.store.identity import (
    START_TIME_TOLERANCE,
    pid_checkable,
    process_start_time,
    same_process,
    this_host,
)
from nnwatch.store.paths import default_root, write_private_file
from nnwatch.store.registry_entry import (
    registry_dir,
    validate_entry,
)
from nnwatch.store.ring_layout import RingError, ring_path
from nnwatch.store.ring_reader import RingReader
from nnwatch.store.safe_read import hole_tail, read_small_file
from nnwatch.store.schema import FieldName, RunMeta

#: A run in another PID namespace (a container) cannot be checked by its pid; gc takes it as gone
#: only after its ring heartbeat has been silent this long (ls calls it crashed much sooner).
FOREIGN_GONE_AFTER = 600.0


@dataclass(frozen=True)
class RunInfo:
    """One registered run, as ``nnwatch ls`` shows it."""

    name: str
    pid: int
    host: str
    rank: int
    world_size: int
    state: str  # starting, running, paused, hung, finished, crashed
    message: str
    step: int | None  # the last step published, None before the first
    steps_per_s: float | None
    age: float  # seconds since the run started
    heartbeat_age: float | None
    last_step_age: float | None
    dropped_records: int  # none for ls; kept for symmetry with readers
    run_dir: str
    ring: str
    socket: str | None
    entry_path: str
    local_rank: int = 0
    start_time: float = 0.0
    started: float = 0.0
    cmdline: list[str] = field(default_factory=list)
    cwd: str = ""
    cuda_devices: list[str] = field(default_factory=list)
    layers: int = 0
    nnwatch_version: str = ""
    #: When things happened, as wall times (what a job's ranks are compared by, see
    #: ``nnwatch.store.job_health``): the trainer's last heartbeat and last step (from the ring
    #: header; None when the ring is gone), and ``end.json`` as the run wrote it (None without one).
    heartbeat_at: float | None = None
    last_step_at: float | None = None
    step_interval: float | None = None
    ending: dict[str, Any] | None = None
    #: The pid lives with the start time it registered; None when that cannot be checked from here.
    alive: bool | None = None
    #: When a reader saw this rank stopped while every other rank of its job still lived
    #: (``first_stop.json``, see :func:`note_first_stop`): it stopped first, for certain.
    seen_first_at: float | None = None
    #: The writer's PID namespace (0: not recorded); its pid is only checked from the same one.
    pid_ns: int = 0
    #: how an ended run ended: "finished", "interrupted" (Ctrl-C, SIGTERM) or "crashed"
    ended_as: str = ""

    @property
    def status(self) -> str:
        """The word a STATUS column shows: the state, and for an ended run how it ended (a
        Ctrl-C reads "interrupted" here as in ``end.json`` and ``load_run``)."""
        return (self.ended_as or self.state) if self.ended else self.state

    @property
    def ended_at(self) -> float | None:
        """When ``end.json`` says the run ended."""
        t = (self.ending or {}).get("ended")
        return float(t) if isinstance(t, (int, float)) else None

    @property
    def ended(self) -> bool:
        """Finished or crashed (its process may be gone, its files stay readable)."""
        return self.state in ("finished", "crashed")

    @property
    def live(self) -> bool:
        """Live: the pid exists with the start time it registered, and the heartbeat is fresh.
        A run hung by a stale heartbeat (stopped, or stuck holding the GIL) is not live; one that
        only stopped stepping is live and hung."""
        return not self.ended and (
            self.heartbeat_age is None or self.heartbeat_age <= HEARTBEAT_STALE
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["live"] = self.live
        d["ended"] = self.ended
        d["status"] = self.status
        return d


def _read_entry(path: Path, problems: list[str] | None = None) -> dict[str, Any] | None:
    """The entry at ``path``, validated; None (with one line in ``problems``) when it is not ours
    or not usable. Never follows a symlink and never blocks on a FIFO."""
    try:
        st = os.lstat(path)
        odd = _not_a_plain_own_file(st)
        if odd is not None:  # only our own regular files: a planted one is named, never followed
            if problems is not None:
                problems.append(f"skipped the registry entry {path.name}: {odd}")
            return None
        entry = validate_entry(loads(read_small_file(path, limit=1024 * 1024)))
    except FileNotFoundError:
        return None  # removed between the listing and the read (a run that closed)
    except (OSError, ValueError, RecursionError) as exc:
        if problems is not None:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            problems.append(f"skipped the registry entry {path.name}: {why or 'unreadable'}")
        return None
    return entry


def _not_a_plain_own_file(st: os.stat_result) -> str | None:
    """What is wrong with a registry entry's file that nnwatch did not write, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink (not followed)"
    if stat.S_ISFIFO(st.st_mode):
        return "it is a FIFO, not a file"
    if stat.S_ISDIR(st.st_mode):
        return "it is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    return None


def inspect(
    entry: dict[str, Any], path: Path, *, now: float | None = None, hung_min: float | None = None
) -> RunInfo:
    """Judge one entry: read its ring header and check its pid and start time."""
    now = time.time() if now is None else now
    host = str(entry.get("host", ""))
    pid = int(entry["pid"])
    start_time = float(entry.get("start_time") or 0.0)
    run_dir = Path(str(entry.get("run_dir", "")))
    ring = str(entry.get("ring", ""))
    pid_ns = int(entry.get("pid_ns") or 0)
    checkable = pid_checkable(host, pid_ns)
    step: int | None = None
    rate: float | None = None
    kwargs: dict[str, Any] = {} if hung_min is None else {"hung_min": hung_min}
    health: Health
    heartbeat_at = last_step_at = interval = None
    try:
        with RingReader(Path(ring)) as reader:
            state = reader.state()
            if state.pid != pid:
                raise RingError("the ring belongs to another process")
            health = Liveness(host=host, run_dir=run_dir, **kwargs).judge(state, now)
            heartbeat_at, last_step_at, interval = _ring_times(state)
            last = reader.latest()
            if last is not None and reader.meta is not None:
                step = _step_of(last[FieldName.STEP][0])
            elif state.write_seq:
                step = state.write_seq - 1
            if state.step_interval > 0 and health.state in ("running", "starting"):
                rate = 1.0 / state.step_interval
    except (RingError, OSError, ValueError, KeyError, OverflowError):
        health, step = _judged_without_ring(host, pid, start_time, run_dir, checkable)
    started = float(entry.get("started") or start_time or now)
    ending = read_end(run_dir) or read_exit_note(run_dir)  # the note: when end.json never came
    alive = same_process(pid, start_time) if checkable else None
    return RunInfo(
        name=str(entry.get("name", "?")), pid=pid, host=host, rank=int(entry.get("rank", 0)),
        world_size=int(entry.get("world_size", 1)), state=health.state, message=health.message,
        step=step, steps_per_s=rate, age=max(0.0, now - started),
        heartbeat_age=health.heartbeat_age, last_step_age=health.last_step_age,
        dropped_records=0, run_dir=str(run_dir), ring=ring, socket=entry.get("socket"),
        entry_path=str(path), local_rank=int(entry.get("local_rank", 0)), start_time=start_time,
        started=started, cmdline=[str(x) for x in entry.get("cmdline") or []],
        cwd=str(entry.get("cwd", "")), cuda_devices=[str(x) for x in entry.get("cuda_devices") or []],
        layers=len(entry.get("layer_names") or []), nnwatch_version=str(entry.get("nnwatch_version", "")),
        heartbeat_at=heartbeat_at, last_step_at=last_step_at, step_interval=interval,
        ending=ending, alive=alive, seen_first_at=_seen_first(run_dir), ended_as=health.ended_as,
        pid_ns=pid_ns,
    )  # fmt: skip


def _judged_without_ring(
    host: str, pid: int, start_time: float, run_dir: Path, checkable: bool
) -> tuple[Health, int | None]:
    """A run whose ring cannot be read: ended (its end.json says how), gone, out of reach, or
    not started yet; and its last step when the end says so."""
    step: int | None = None
    end = read_end(run_dir)
    alive = same_process(pid, start_time) if checkable else None
    if end is not None:
        state_name = "crashed" if end.get("status") == "crashed" else "finished"
        health = Health(
            state_name, end_message(end), None, None, None, ended_as(end.get("status"))
        )
    elif alive is False:
        health = Health("crashed", gone_message(pid), None, None, None, "crashed")
    elif alive is None:
        where = "on another host" if host != this_host() else "in another PID namespace"
        health = Health(
            "hung", f"{where}, and its ring is unreadable from here", None, None, None
        )
    else:
        health = Health("starting", "no ring yet (before the first step)", None, None, None)
    if end is not None and isinstance(end.get("steps"), int):
        step = int(end["steps"]) - 1
    return health, step


FIRST_STOP_FILE = "first_stop.json"


def note_first_stop(run_dir: str | Path, rank: int, others: list[int], how: str) -> None:
    """Record, in a rank's run directory, that a reader saw it stopped while the other ranks of
    its job (``others``) still lived. Once they are gone too, their deaths may be too close to
    order from the files alone; this keeps the answer. Written once; failures are ignored."""
    path = Path(run_dir) / FIRST_STOP_FILE
    if path.exists():
        return
    note = {"rank": int(rank), "seen_at": time.time(), "others_alive": others, "how": how}
    try:
        write_private_file(path, json.dumps(note).encode())
    except OSError:
        pass  # a read-only copy of a run: nothing is lost but the certainty


def _seen_first(run_dir: str | Path) -> float | None:
    try:
        note = loads(read_small_file(Path(run_dir) / FIRST_STOP_FILE, limit=65536))
        seen = float(note["seen_at"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return seen if math.isfinite(seen) else None


def _ring_times(state: Any) -> tuple[float | None, float | None, float | None]:
    """The ring header's heartbeat, last step and usual step interval, None where unset."""
    return (
        state.heartbeat or None,
        state.last_publish or None,
        state.step_interval or None,
    )


def _step_of(value: Any) -> int | None:
    """A step number read from a record, or None when it is not one (NaN, negative, absurd)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and 0 <= f < 2**53 else None


def list_runs(
    root: Path | None = None, *, hung_min: float | None = None, problems: list[str] | None = None
) -> list[RunInfo]:
    """Every registered run of this user, oldest first, each judged live or not right now.

    An entry that cannot be read or judged is skipped, with one line saying why in ``problems``:
    one bad file never hides the other runs.
    """
    reg = registry_dir(root)
    if not reg.is_dir():
        return []
    now = time.time()
    runs = []
    for path in sorted(reg.glob("*.json")):
        entry = _read_entry(path, problems)
        if entry is None:
            continue
        try:
            runs.append(inspect(entry, path, now=now, hung_min=hung_min))
        except Exception as exc:  # noqa: BLE001 - one bad entry must not break ls or gc
            if problems is not None:
                problems.append(f"skipped the registry entry {path.name}: {exc}")
    runs.sort(key=lambda r: (r.started, r.name, r.rank))
    return runs


def find_runs(spec: str, root: Path | None = None) -> list[RunInfo]:
    """Runs matching what a user typed: a name (or its start), a pid, or a run directory path."""
    runs = list_runs(root)
    spec = spec.strip()
    if not spec:
        return []
    by_pid = [r for r in runs if spec.isdigit() and r.pid == int(spec)]
    if by_pid:
        return by_pid
    as_path = os.path.realpath(os.path.expanduser(spec))
    by_dir = [r for r in runs if os.path.realpath(r.run_dir) == as_path]
    if by_dir:
        return by_dir
    exact = [r for r in runs if r.name == spec or Path(r.run_dir).name == spec]
    if exact:
        return exact
    return [r for r in runs if r.name.startswith(spec) or Path(r.run_dir).name.startswith(spec)]


def recorded_runs(root: Path | None = None, *, problems: list[str] | None = None) -> list[RunInfo]:
    """Run directories under the root that have no registry entry: finished or crashed runs."""
    root = Path(root) if root is not None else default_root()
    if not root.is_dir():
        return []
    registered = {os.path.realpath(r.run_dir) for r in list_runs(root)}
    now = time.time()
    out = []
    # watch() puts runs under <root>/runs/; a run_dir passed by the user may sit in the root
    found = sorted({*root.glob("runs/*/meta.json"), *root.glob("*/meta.json")})
    for meta_path in found:
        run_dir = meta_path.parent
        if os.path.realpath(run_dir) in registered:
            continue
        try:
            info = inspect_dir(run_dir, now=now)
        except Exception as exc:  # noqa: BLE001 - one damaged run must not hide the others
            if problems is not None:
                problems.append(f"skipped {run_dir.name}: {exc}")
            continue
        if info is not None:
            out.append(info)
        elif problems is not None:
            problems.append(f"skipped {run_dir.name}: its meta.json is unreadable or corrupt")
    out.sort(key=lambda r: (r.started, r.name, r.rank))
    return out


def inspect_dir(
    run_dir: Path | str, *, now: float | None = None, hung_min: float | None = None
) -> RunInfo | None:
    """Judge a run from its directory alone (no registry entry: finished, crashed, copied);
    None when it holds no readable ``meta.json``."""
    now = time.time() if now is None else now
    run_dir = Path(run_dir)
    try:
        meta = RunMeta.from_json(read_small_file(run_dir / "meta.json"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    end = read_end(run_dir)
    steps = end.get("steps") if end is not None else None
    heartbeat_at = last_step_at = interval = None
    kwargs: dict[str, Any] = {} if hung_min is None else {"hung_min": hung_min}
    copy = read_copy_note(run_dir)
    try:
        if copy is not None:  # a copy: no pid or heartbeat here is its writer's
            raise RingError(describe_copy(copy))
        with RingReader(ring_path(run_dir, meta.rank)) as reader:
            ring_state = reader.state()
            health = Liveness(host=meta.host, run_dir=run_dir, **kwargs).judge(ring_state, now)
            heartbeat_at, last_step_at, interval = _ring_times(ring_state)
        state, message, how = health.state, health.message, health.ended_as
    except (RingError, OSError, ValueError):
        state, message, how = _dir_state_without_ring(meta, end, copy)
    if not isinstance(steps, int):
        try:  # rows in scalars.bin: 64-byte header, then fixed-size rows (a hole is none)
            size = hole_tail(run_dir / "scalars.bin")[1]
            steps = max(0, (size - 64) // meta.schema.scalar_size)
        except OSError:
            steps = None
    alive = (
        run_process_alive(meta.pid, meta.started) if _checkable(meta) and copy is None else None
    )
    return RunInfo(
        name=meta.name, pid=meta.pid, host=meta.host, rank=meta.rank,
        world_size=meta.world_size, state=state, message=message,
        step=(steps - 1) if isinstance(steps, int) and steps > 0 else None,
        steps_per_s=None, age=max(0.0, now - meta.started),
        heartbeat_age=None if heartbeat_at is None else max(0.0, now - heartbeat_at),
        last_step_age=None if last_step_at is None else max(0.0, now - last_step_at),
        dropped_records=0, run_dir=str(run_dir), ring=str(ring_path(run_dir, meta.rank)),
        socket=None, entry_path="", local_rank=meta.local_rank, started=meta.started,
        layers=meta.schema.num_layers, nnwatch_version=meta.nnwatch_version,
        heartbeat_at=heartbeat_at, last_step_at=last_step_at, step_interval=interval,
        ending=end or read_exit_note(run_dir), alive=alive, seen_first_at=_seen_first(run_dir),
        ended_as=how,
    )  # fmt: skip


def _dir_state_without_ring(
    meta: RunMeta, end: dict[str, Any] | None, copy: dict[str, Any] | None
) -> tuple[str, str, str]:
    """(state, message, how it ended) of a run directory whose ring cannot be read: its
    end.json, a copy's note, or whether its process is still there."""
    how = ""
    if end is not None:
        state = "crashed" if end.get("status") == "crashed" else "finished"
        message, how = end_message(end), ended_as(end.get("status"))
        if copy is not None:
            message = f"{message}; {describe_copy(copy)}"
    elif copy is not None:
        state, message, how = "finished", describe_copy(copy), "copied"
    else:
        alive_now = run_process_alive(meta.pid, meta.started) if _checkable(meta) else None
        if alive_now is False:
            state, message, how = "crashed", gone_message(meta.pid), "crashed"
        elif alive_now is None:
            state, message = "hung", "on another host, and its ring is unreadable from here"
        else:
            state, message = "running", "unregistered, and its ring is unreadable"
    return state, message, how


def _checkable(meta: RunMeta) -> bool:
    """Whether the pid in ``meta.json`` can be checked from here (same host and PID namespace)."""
    return pid_checkable(meta.host, (meta.extra or {}).get("pid_ns"))


def run_process_alive(pid: int, started: float) -> bool:
    """Whether the process that wrote a run still lives, from ``meta.json`` alone: its pid exists
    and that process started before the run did (a younger process has reused the pid)."""
    now_start = process_start_time(pid)
    return now_start is not None and now_start <= started + START_TIME_TOLERANCE


def refresh(info: RunInfo, *, hung_min: float | None = None) -> RunInfo:
    """The same run judged again now: from its registry entry while there is one, else from its
    directory. A run that cannot be read any more is returned as it was."""
    if info.entry_path:
        path = Path(info.entry_path)
        entry = _read_entry(path)
        if entry is not None:
            return inspect(entry, path, hung_min=hung_min)
    return inspect_dir(info.run_dir, hung_min=hung_min) or info
