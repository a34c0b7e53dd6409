"""Live runs as a :class:`RunSource`: history first, then the live tail, de-duplicated by step.

Two ways in, one behaviour:

- :class:`LiveSource` reads the run's files on this machine: the run log (``load_run``) for the
  history, the ring for the tail, ``events.jsonl`` for events, and steers through the command
  socket. Any number of these can follow one run; the trainer never knows.
- :class:`ConnectedSource` has only a socket, typically forwarded with ``ssh -L``. It subscribes,
  and a stream process on the training host reads those same files and sends them, so the trainer
  does no more work than for a local monitor.

Ring records are split the way the run log splits them: every record becomes a scalars row, and
a layer row is kept for steps whose per-layer stats were sampled or that held a non-finite value.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.channel.client import ChannelError, Subscription
from nnwatch.channel.pause import KeptConnection
from nnwatch.sources.base import CommandReply, RunSource, SourceError, SourceStatus, SourceUpdate
from nnwatch.sources.seen_events import SeenEvents
from nnwatch.store.event_tail import EventTail
from nnwatch.store.events import Event
from nnwatch.store.health import Health, Liveness, end_message, ended_as, read_end
from nnwatch.store.identity import pid_checkable, same_process
from nnwatch.store.log_catchup import gap_rows, load_history
from nnwatch.store.record_split import schema_dtypes, split_records
from nnwatch.store.registry import RunInfo, find_runs, list_runs
from nnwatch.store.ring_layout import RingError, ring_path
from nnwatch.store.ring_reader import RingReader
from nnwatch.store.safe_read import read_small_file
from nnwatch.store.schema import FieldName, RunMeta

#: Health states (see nnwatch.store.health) as the UI's source states.
_STATE = {
    "starting": "live",
    "running": "live",
    "paused": "paused",
    "hung": "hung",
    "finished": "finished",
    "crashed": "crashed",
}
STEERABLE = ("live", "paused", "hung")


class _StepFilter:
    """Drops rows already delivered: history and tail overlap, and reconnects repeat."""

    def __init__(self) -> None:
        self.last_scalar = -np.inf
        self.last_layer = -np.inf

    def scalars(self, rows: np.ndarray) -> np.ndarray:
        if len(rows) == 0:
            return rows
        rows = rows[rows[FieldName.STEP] > self.last_scalar]
        if len(rows):
            self.last_scalar = float(rows[FieldName.STEP].max())
        return rows

    def layers(self, rows: np.ndarray) -> np.ndarray:
        if len(rows) == 0:
            return rows
        rows = rows[rows[FieldName.STEP] > self.last_layer]
        if len(rows):
            self.last_layer = float(rows[FieldName.STEP].max())
        return rows


def concat_rows(parts: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Record arrays of one dtype, joined (empty parts skipped): one array, never a list."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return np.zeros(0, dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class LiveSource(RunSource):
    """Follow a run through its files on this machine (run log + ring + events + socket)."""

    def __init__(
        self,
        run_dir: Path | str,
        *,
        ring: Path | str | None = None,
        socket: Path | str | None = None,
        hung_min: float | None = None,
        command_timeout: float = 10.0,
    ) -> None:
        self.run_dir = Path(run_dir).expanduser()
        meta_path = self.run_dir / "meta.json"
        try:
            self._meta = RunMeta.from_json(read_small_file(meta_path))
        except FileNotFoundError:
            raise SourceError(
                f"{self.run_dir} has no meta.json: not an nnwatch run, or it has not stepped yet"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"cannot read {meta_path}: {exc}") from None
        self.ring_path = Path(ring) if ring else ring_path(self.run_dir, self._meta.rank)
        self.socket_path = Path(socket) if socket else None
        self.command_timeout = command_timeout
        kwargs: dict[str, Any] = {} if hung_min is None else {"hung_min": hung_min}
        self._liveness = Liveness(host=self._meta.host, run_dir=self.run_dir, **kwargs)
        self._filter = _StepFilter()
        self._events = EventTail(self.run_dir / "events.jsonl")
        self._reader: RingReader | None = None
        self._commands: KeptConnection | None = None  # once a command is sent
        self._history_done = False
        self._check_gap = False
        self._health: Health | None = None
        self._closed = False
        self._open_ring()

    @classmethod
    def from_info(cls, info: RunInfo, **kwargs: Any) -> LiveSource:
        return cls(info.run_dir, ring=info.ring or None, socket=info.socket, **kwargs)

    @classmethod
    def find(cls, spec: str, **kwargs: Any) -> LiveSource:
        """Open the registered run a user named (name, pid or run directory); see ``nnwatch ls``."""
        runs = find_runs(spec)
        if not runs:
            if Path(spec).expanduser().is_dir():
                return cls(spec, **kwargs)
            raise SourceError(f"no registered run matches {spec!r}; `nnwatch ls` lists them")
        if len(runs) > 1:
            names = ", ".join(f"{Path(r.run_dir).name} (pid {r.pid}, rank {r.rank})" for r in runs)
            raise SourceError(f"{spec!r} matches several runs: {names}; name one of them")
        return cls.from_info(runs[0], **kwargs)

    def _open_ring(self) -> None:
        try:
            self._reader = RingReader(self.ring_path, start="oldest")
        except RingError:
            self._reader = None

    # -- RunSource -------------------------------------------------------------------------------
    @property
    def meta(self) -> RunMeta:
        return self._meta

    @property
    def can_command(self) -> bool:
        state = self._status().state
        return state in STEERABLE and self._find_socket() is not None

    def poll(self) -> SourceUpdate:
        if self._closed:
            raise SourceError("this live source is closed")
        schema = self._meta.schema
        scalar_parts: list[np.ndarray] = []
        layer_parts: list[np.ndarray] = []
        if not self._history_done:
            self._history_done = True
            loaded = load_history(self.run_dir)
            if loaded is not None:
                scalar_parts.append(self._filter.scalars(loaded[0]))
                layer_parts.append(self._filter.layers(loaded[1]))
                self._check_gap = bool(len(loaded[0]))
        if self._reader is None and self.ring_path.exists():
            self._open_ring()
        if self._reader is not None:
            scalars, layers = self._reader.read_rows(schema)
            if len(scalars):
                if self._check_gap:  # the log was read after the ring: did it reach the ring?
                    self._check_gap = False
                    first = float(scalars[FieldName.STEP][0])
                    if first > self._filter.last_scalar + 1:
                        gap = gap_rows(self.run_dir, self._filter.last_scalar, first)
                        if gap is not None:
                            scalar_parts.append(self._filter.scalars(gap[0]))
                            layer_parts.append(self._filter.layers(gap[1]))
                scalar_parts.append(self._filter.scalars(scalars))
                layer_parts.append(self._filter.layers(layers))
        events = self._events.read_events()
        return SourceUpdate(
            scalars=concat_rows(scalar_parts, schema_dtypes(schema)[0]),
            layers=concat_rows(layer_parts, schema_dtypes(schema)[1]),
            events=events,
            status=self._status(),
        )

    def _status(self) -> SourceStatus:
        now = time.time()
        reader = self._reader
        if reader is None:
            end = read_end(self.run_dir)
            if end is not None:  # the word every reader uses: a Ctrl-C reads "interrupted"
                return SourceStatus(ended_as(end.get("status")), message=end_message(end))
            checkable = pid_checkable(self._meta.host, (self._meta.extra or {}).get("pid_ns"))
            if self._meta.pid and checkable and not same_process(self._meta.pid, 0.0):
                return SourceStatus("crashed", message=f"trainer pid {self._meta.pid} is gone")
            return SourceStatus("live", message="waiting for the ring")
        health = self._liveness.judge(reader.state(), now)
        self._health = health
        state = _STATE.get(health.state, "live")
        if health.ended and health.ended_as == "interrupted":
            state = "interrupted"  # as end.json, ls and load_run say
        return SourceStatus(
            state=state,
            heartbeat_age=health.heartbeat_age,
            dropped=reader.dropped,
            torn=reader.torn,
            message=health.message,
        )

    def _find_socket(self) -> Path | None:
        """The command socket from this run's registry entry, when none was given."""
        if self.socket_path is None:
            here = os.path.realpath(self.run_dir)
            for info in list_runs():
                if info.socket and os.path.realpath(info.run_dir) == here:
                    self.socket_path = Path(info.socket)
                    break
        return self.socket_path

    def command(self, name: str, **args: Any) -> CommandReply:
        path = self._find_socket()
        if path is None:
            return CommandReply(False, error="this run has no command socket; it cannot be steered")
        if self._commands is None or self._commands.path != path:
            self._close_commands()
            self._commands = KeptConnection(path, timeout=self.command_timeout)
        return self._commands.send(name, args)

    def _close_commands(self) -> None:
        if self._commands is not None:
            self._commands.close()
            self._commands = None

    def reconnect(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._open_ring()
        self._close_commands()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.close()
        self._close_commands()


#: Waits between reconnection attempts after the stream was lost (then the last one, repeated).
BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)


class ConnectedSource(RunSource):
    """Follow a run through nothing but its command socket (e.g. forwarded with ``ssh -L``).

    It resumes rather than restarts: after a lost connection or a ``reconnect`` it subscribes
    again with the last step, ring sequence and events offset it holds, so only what is new comes
    down the link, and it does so by itself, with back-off (``BACKOFF``), while the run is not
    known to have ended. Nothing read from the link is dropped: rows decoded in a poll are kept
    until a poll returns them, whatever else that poll meets. Only repeats are: a row at or
    before the last step held, and an event line delivered before (``SeenEvents``).
    """

    def __init__(
        self,
        socket: Path | str,
        *,
        timeout: float = 10.0,
        max_hz: float = 20.0,
        auto_reconnect: bool = True,
    ) -> None:
        self.socket_path = Path(socket).expanduser()
        self.timeout = timeout
        self.max_hz = max_hz
        self.auto_reconnect = auto_reconnect
        self._filter = _StepFilter()
        self._commands = KeptConnection(self.socket_path, timeout=timeout)
        self._status_msg: dict[str, Any] = {}
        self._dropped = 0  # steps neither the ring nor the run log had (gap messages)
        self._torn = 0
        self.gaps: list[tuple[float | None, float, int]] = []
        self._next_seq: int | None = None
        self._events_offset = 0
        self._seen_events = SeenEvents()  # a resumed stream may send a line again
        self._latest_step: float | None = None
        self._caught_up = False
        self._closed = False
        self._attempt = 0
        self._next_try = 0.0
        self._reconnect_error = ""
        self._pending: tuple[list[np.ndarray], list[np.ndarray], list[Event]] = (
            [], [], []
        )  # fmt: skip
        self.subscriptions = 0
        self.received_before = 0  # bytes read by earlier subscriptions
        self._sub = self._subscribe()
        self._meta = self._sub.meta

    def _subscribe_extra(self) -> dict[str, Any] | None:
        """More ``subscribe`` arguments (a summarised source asks for the overview)."""
        return None

    def _subscribe(self) -> Subscription:
        resume = self._filter.last_scalar > -np.inf
        try:
            sub = Subscription(
                self.socket_path, max_hz=self.max_hz, timeout=self.timeout,
                after_step=self._filter.last_scalar if resume else None,
                start=self._next_seq if self._next_seq is not None else "oldest",
                events_offset=self._events_offset, extra=self._subscribe_extra(),
            )  # fmt: skip
        except ChannelError as exc:
            raise SourceError(str(exc)) from None
        self.subscriptions += 1
        self._caught_up = False
        latest = sub.info.get("latest_step")
        if isinstance(latest, (int, float)):
            self._latest_step = float(latest)
        return sub

    @property
    def received(self) -> int:
        """Bytes read from the run over every connection so far."""
        return self.received_before + self._sub.received

    @property
    def meta(self) -> RunMeta:
        return self._meta

    @property
    def can_command(self) -> bool:
        return not self._sub.lost and self._status().state in STEERABLE

    def _take(self, msg: dict[str, Any]) -> None:
        """File one message's content into the pending parts (rows filtered by step)."""
        scalar_parts, layer_parts, events = self._pending
        kind = msg.get("type")
        if kind == "scalars":
            scalar_parts.append(self._filter.scalars(msg["rows"]))
        elif kind == "layers":
            layer_parts.append(self._filter.layers(msg["rows"]))
        elif kind == "records":
            self._torn += int(msg.get("torn") or 0)
            self._dropped += int(msg.get("dropped") or 0)  # an older stream's count
            if isinstance(msg.get("next_seq"), int):
                self._next_seq = int(msg["next_seq"])
            scalars, layers = split_records(msg["rows"], self._meta.schema)
            scalar_parts.append(self._filter.scalars(scalars))
            layer_parts.append(self._filter.layers(layers))
        elif kind == "gap":
            missing = int(msg.get("missing") or 0)
            self._dropped += missing
            after = msg.get("after_step")
            self.gaps.append((
                float(after) if isinstance(after, (int, float)) else None,
                float(msg.get("before_step") or 0.0), missing,
            ))  # fmt: skip
        elif kind == "events":
            if isinstance(msg.get("offset"), int):
                self._events_offset = int(msg["offset"])
            events.extend(self._seen_events.fresh(msg.get("events") or []))
        elif kind in ("status", "end", "error"):
            self._status_msg = msg
            if kind == "status":
                latest = msg.get("latest_step")
                if isinstance(latest, (int, float)):
                    self._latest_step = float(latest)
                self._caught_up = bool(msg.get("caught_up", True))

    def poll(self) -> SourceUpdate:
        if self._closed:
            raise SourceError("this source is closed")
        if self._sub.lost and self._sub.ended is None and self.auto_reconnect:
            self._retry()
        for msg in self._sub.poll(0.0):
            self._take(msg)
        schema = self._meta.schema
        scalar_parts, layer_parts, events = self._pending
        self._pending = ([], [], [])
        return SourceUpdate(
            scalars=concat_rows(scalar_parts, schema_dtypes(schema)[0]),
            layers=concat_rows(layer_parts, schema_dtypes(schema)[1]),
            events=events,
            status=self._status(),
        )

    def _retry(self) -> None:
        """One reconnection attempt when its back-off has passed."""
        now = time.monotonic()
        if now < self._next_try:
            return
        try:
            self._resubscribe()
        except SourceError as exc:
            self._reconnect_error = str(exc)
            self._next_try = time.monotonic() + BACKOFF[min(self._attempt, len(BACKOFF) - 1)]
            self._attempt += 1
            return
        self._attempt = 0
        self._reconnect_error = ""

    def _resubscribe(self) -> None:
        sub = self._subscribe()
        self.received_before += self._sub.received
        self._sub.close()
        self._sub = sub
        self._status_msg = {}

    def _status(self) -> SourceStatus:
        msg = self._status_msg
        if self._sub.ended is not None:
            msg = self._sub.ended
        elif self._sub.lost:
            message = f"the connection to {self.socket_path} closed (the tunnel or the run is gone)"
            if self.auto_reconnect:
                wait = max(0.0, self._next_try - time.monotonic())
                message += f"; reconnecting (attempt {self._attempt + 1}"
                message += f", in {wait:.0f} s)" if wait >= 1 else ")"
            return SourceStatus(
                "lost", dropped=self._dropped, torn=self._torn, message=message,
            )  # fmt: skip
        if msg.get("type") == "error":
            return SourceStatus("lost", message=str(msg.get("message", "")))
        state = _STATE.get(str(msg.get("state", "running")), "live")
        age = msg.get("heartbeat_age")
        behind = None
        if not self._caught_up and self._latest_step is not None and state in STEERABLE:
            have = self._filter.last_scalar
            if have < self._latest_step:
                behind = (have if have > -np.inf else 0.0, self._latest_step)
        return SourceStatus(
            state=state,
            heartbeat_age=float(age) if isinstance(age, (int, float)) else None,
            dropped=self._dropped,
            torn=self._torn,
            message=str(msg.get("message") or ""),
            catching_up=behind,
        )

    def command(self, name: str, **args: Any) -> CommandReply:
        return self._commands.send(name, args)

    def reconnect(self) -> None:
        """Subscribe again, resuming after what is held: only what is new comes down the link."""
        self._resubscribe()
        self._attempt = 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sub.close()
        self._commands.close()
