"""Is a run running, paused, hung, finished or crashed? One judgement, shared by every reader.

The trainer can only say what it knows: it writes "running", "paused" or (at a clean close)
"finished" into the ring header. Everything else is inferred here from facts a reader can check:

- crashed: the writer's pid is gone, or now belongs to another process (start time differs), and
  the run never said it finished (neither the ring status nor ``end.json``). A ``kill -9`` is seen
  as soon as a reader looks, since checking a pid is immediate.
- hung: the process lives but its heartbeat (1 Hz, from a thread) is stale, which means the whole
  process is stopped or stuck holding the GIL; or no step came for many times the usual step time.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnwatch.store.clean_text import loads
from nnwatch.store.event_appender import EVENTS_FILE
from nnwatch.store.events import Event, RunEnded, parse_line
from nnwatch.store.identity import pid_checkable, same_process
from nnwatch.store.ring_layout import ENDED
from nnwatch.store.ring_reader import RingReader, RingState
from nnwatch.store.safe_read import held_size, open_file, read_small_file

#: The heartbeat thread beats at 1 Hz; this many seconds without one means the process is frozen.
HEARTBEAT_STALE = 5.0
#: "No step for many times the usual step time": this factor, but never less than HUNG_MIN seconds.
HUNG_FACTOR = 20.0
HUNG_MIN = 10.0
END_FILE = "end.json"


@dataclass(frozen=True)
class Health:
    """A run's state as a reader judges it, with the numbers behind the judgement."""

    state: str  # "starting", "running", "paused", "hung", "finished" or "crashed"
    message: str  # plain words for a header line, e.g. "trainer pid 123 is gone"
    heartbeat_age: float | None
    last_step_age: float | None
    step_interval: float | None  # usual seconds per step (moving average), None until known
    #: how an ended run ended, in the one word every reader shows (see :func:`ended_as`)
    ended_as: str = ""

    @property
    def ended(self) -> bool:
        """Finished or crashed: nothing more will come."""
        return self.state in ("finished", "crashed")

    @property
    def live(self) -> bool:
        """Its process is there (same pid and start time) and its heartbeat is fresh."""
        return not self.ended and (
            self.heartbeat_age is None or self.heartbeat_age <= HEARTBEAT_STALE
        )


def read_end(run_dir: Path | None) -> dict[str, Any] | None:
    """The run's ``end.json`` (written at close), or None when there is none.

    One that exists but cannot be read (empty, cut short, not JSON, not an object) still says the
    run reached its close: it reads as ended, with the status its ``run_ended`` event gives (a run
    that ended otherwise than cleanly logs one before ``end.json``), else "finished", and
    ``"damaged"`` says why. ``ls``, ``open`` and ``load_run`` all read it here, so they agree.
    """
    if run_dir is None:
        return None
    path = Path(run_dir) / END_FILE
    try:
        raw = read_small_file(path, limit=1 << 20)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if not os.path.lexists(path):
            return None
        return _damaged_end(Path(run_dir), f"it cannot be read: {exc.strerror or exc}")
    try:
        end = clean_end(loads(raw))
    except (ValueError, RecursionError):
        end = None
    if end is None:
        return _damaged_end(Path(run_dir), "it is empty" if not raw.strip() else "not a JSON object")
    return end


def _damaged_end(run_dir: Path, why: str) -> dict[str, Any]:
    status = "finished"
    for ev in tail_events(run_dir / EVENTS_FILE):
        if isinstance(ev, RunEnded) and ev.status in ("crashed", "interrupted", "stopped"):
            status = ev.status
    return {"status": status, "damaged": f"{END_FILE} is corrupt ({why})"}


def tail_events(path: Path, limit: int = 1 << 16) -> list[Event]:
    """The events in the last ``limit`` bytes of ``events.jsonl`` (unreadable lines skipped)."""
    try:
        with open_file(path) as fh:
            size = held_size(fh.fileno())
            fh.seek(max(0, size - limit))
            data = fh.read(min(limit, size))
    except OSError:
        return []
    return [ev for ev in map(parse_line, data.splitlines()) if ev is not None]


def ended_as(status: object) -> str:
    """The one word for how an ended run ended, everywhere (``ls``, ``open``, ``load_run``):
    "crashed", "interrupted" (Ctrl-C or SIGTERM; the ring says "stopped") or "finished"."""
    if status == "crashed":
        return "crashed"
    if status in ("interrupted", "stopped"):
        return "interrupted"
    return "finished"


def clean_end(end: object) -> dict[str, Any] | None:
    """``end.json`` as read from disk, with every field a reader uses checked: None when it is not
    a JSON object; a status that is not one of ours reads "finished" (the run did write it at its
    end); a step count or time of the wrong type is dropped."""
    if not isinstance(end, dict):
        return None
    out = dict(end)
    status = out.get("status")
    if status not in ("finished", "crashed", "interrupted", "stopped"):
        out["status"] = "finished"
    steps = out.get("steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps < 1 << 53):
        out.pop("steps")
    ended = out.get("ended")
    if ended is not None and (
        isinstance(ended, bool) or not isinstance(ended, (int, float)) or not math.isfinite(ended)
    ):
        out.pop("ended")
    return out


def judge(
    state: RingState,
    *,
    now: float,
    writer_alive: bool | None,
    end: dict[str, Any] | None = None,
    hung_factor: float = HUNG_FACTOR,
    hung_min: float = HUNG_MIN,
    heartbeat_stale: float = HEARTBEAT_STALE,
) -> Health:
    """Combine the ring header, the pid check (None when the writer is on another host) and
    ``end.json`` into one state."""
    hb_age = state.heartbeat_age(now)
    step_age = state.last_step_age(now)
    interval = state.step_interval or None

    def health(name: str, message: str, how: str = "") -> Health:
        return Health(name, message, hb_age, step_age, interval, how)

    if state.status in ENDED or end is not None:
        said = state.status if state.status in ENDED else str((end or {}).get("status", "finished"))
        name = "crashed" if said == "crashed" else "finished"
        return health(name, end_message(end, said), ended_as(said))
    if writer_alive is False:
        return health("crashed", gone_message(state.pid), "crashed")
    if writer_alive is None and hb_age > max(heartbeat_stale, 3 * hung_min):
        return health(
            "crashed",
            f"no heartbeat for {hb_age:.0f} s from a trainer on another host or in another PID "
            "namespace (its pid cannot be checked from here)",
        )
    if hb_age > heartbeat_stale:
        return health(
            "hung",
            f"no heartbeat for {hb_age:.0f} s: the process is stopped or stuck holding the GIL",
        )
    logged = f"its run log stopped: {state.log_error}" if state.log_error else ""
    if state.status == "paused":
        return health("paused", "paused by a monitor" + (f"; {logged}" if logged else ""))
    if step_age is None:
        return health("starting", "waiting for the first step")
    limit = max(hung_min, hung_factor * (interval or 0.0))
    if step_age > limit:
        usual = f"usual {interval:.3g} s" if interval else "no usual step time yet"
        return health("hung", f"no step for {step_age:.0f} s ({usual})")
    return health(state.status if state.status != "starting" else "running", logged)


def gone_message(pid: int) -> str:
    """A writer that vanished without ``end.json``: no handler ran, so no SIGTERM or Ctrl-C."""
    return (
        f"trainer pid {pid} is gone and the run never finished, without a word from it (SIGKILL, "
        "the OOM killer, os._exit or a segfault)"
    )


def end_message(end: dict[str, Any] | None, said: str = "") -> str:
    """ "the run ended (interrupted: SIGTERM ...)", from ``end.json`` (or the ring's word)."""
    end = end or {}
    how = ended_as(end.get("status", said or "finished"))
    if end.get("damaged"):
        return f"the run ended ({how}; its {end['damaged']})"
    why = end.get("signal") or ""
    if how == "interrupted" and not why:
        reason = str(end.get("reason") or "")
        why = "Ctrl-C" if "KeyboardInterrupt" in reason else reason[:80]
    if how == "finished":
        return "the run ended"
    return f"the run ended ({how}" + (f": {why})" if why else ")")


def writer_alive(state: RingState, host: str | None) -> bool | None:
    """Whether the ring's writer still lives; None when it runs on another host or in another
    PID namespace (a container sharing /dev/shm), where its pid names some other process."""
    if not pid_checkable(host, state.pid_ns):
        return None
    return same_process(state.pid, state.start_time)


class Liveness:
    """Judges one ring's writer again and again, checking its pid at most a few times a second."""

    def __init__(
        self,
        *,
        host: str | None,
        run_dir: Path | None,
        check_every: float = 0.25,
        hung_factor: float = HUNG_FACTOR,
        hung_min: float = HUNG_MIN,
    ) -> None:
        self.host = host
        self.run_dir = run_dir
        self.check_every = check_every
        self.hung_factor = hung_factor
        self.hung_min = hung_min
        self._checked_at = -1e18
        self._alive: bool | None = True
        self._end: dict[str, Any] | None = None

    def judge(self, state: RingState, now: float) -> Health:
        if now - self._checked_at >= self.check_every:
            self._checked_at = now
            self._end = read_end(self.run_dir)
            if self._end is None and state.status not in ENDED:
                self._alive = writer_alive(state, self.host)
        return judge(
            state, now=now, writer_alive=self._alive, end=self._end,
            hung_factor=self.hung_factor, hung_min=self.hung_min,
        )  # fmt: skip


def ring_health(reader: RingReader, **liveness: object) -> Health:
    """Running, paused, hung, finished or crashed: the state of a ring's writer, judged now."""
    host = reader.meta.host if reader.meta is not None else None
    judge = Liveness(host=host, run_dir=reader.path.parent, **liveness)  # type: ignore[arg-type]
    return judge.judge(reader.state(), time.time())
