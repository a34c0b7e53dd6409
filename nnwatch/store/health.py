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

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from nnwatch.store.identity import same_process, this_host
from nnwatch.store.paths import read_small_file
from nnwatch.store.ring_layout import ENDED
from nnwatch.store.ring_reader import RingReader, RingState

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


def read_end(run_dir: Path | None) -> dict | None:
    """The run's ``end.json`` (written at a clean close), or None."""
    if run_dir is None:
        return None
    try:
        end = json.loads(read_small_file(Path(run_dir) / END_FILE))
    except (OSError, ValueError, RecursionError):
        return None
    return clean_end(end)


def clean_end(end: object) -> dict | None:
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
    end: dict | None = None,
    hung_factor: float = HUNG_FACTOR,
    hung_min: float = HUNG_MIN,
    heartbeat_stale: float = HEARTBEAT_STALE,
) -> Health:
    """Combine the ring header, the pid check (None when the writer is on another host) and
    ``end.json`` into one state."""
    hb_age = state.heartbeat_age(now)
    step_age = state.last_step_age(now)
    interval = state.step_interval or None

    def health(name: str, message: str) -> Health:
        return Health(name, message, hb_age, step_age, interval)

    if state.status in ENDED or end is not None:
        said = state.status if state.status in ENDED else str((end or {}).get("status", "finished"))
        name = "crashed" if said == "crashed" else "finished"
        return health(name, "the run ended" + ("" if said == name else f" ({said})"))
    if writer_alive is False:
        return health("crashed", f"trainer pid {state.pid} is gone and the run never finished")
    if writer_alive is None and hb_age > max(heartbeat_stale, 3 * hung_min):
        return health("crashed", f"no heartbeat for {hb_age:.0f} s from a trainer on another host")
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


def writer_alive(state: RingState, host: str | None) -> bool | None:
    """Whether the ring's writer still lives; None when it runs on another host."""
    if host is not None and host != this_host():
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
        self._end: dict | None = None

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
