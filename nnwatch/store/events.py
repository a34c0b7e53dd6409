"""The events of a run as types: what the probe writes to ``events.jsonl`` and monitors read back.

One line of ``events.jsonl`` is one event: a detector's finding, a snapshot taken or failed, a
step the guard skipped, a command applied, an exception in the training loop, the run's end, the
log's own failure. Producers build one of the frozen classes below and the run log writes its
``to_json()``; readers get them back with :func:`parse_line` or :meth:`Event.from_json`, which
never raise: a line from an older or newer nnwatch, or a damaged one, becomes an
:class:`OtherEvent` that keeps its raw fields, since monitors read runs written by other versions.

Why every event is also a read-only ``Mapping`` of its JSON fields: ``load_run(...).events`` has
always been a list of the lines as dicts, read in notebooks and tests as ``e["kind"]`` and
``e.get("type")``. Keeping those reads on the typed event lets one list be typed from the probe
to the TUI, instead of a dict list for users beside a typed one inside. A parsed event keeps its
fields exactly as read, and ``to_json()`` gives them back, so a line passes through a monitor or
a copy unchanged (an old command line's ``name`` included); the typed attributes are the parsed
view of them. Equality is the mapping's: an event equals the dict of its line.

The wire stays JSON: the channel forwards the lines as dicts and a source parses them here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nnwatch.store.clean_text import loads
from nnwatch.store.finding import Finding

FINDING = "finding"
SNAPSHOT = "snapshot"
SNAPSHOT_FAILED = "snapshot_failed"
SKIPPED_STEP = "skipped_step"
COMMAND = "command"
ERROR = "error"
RUN_ENDED = "run_ended"
LOG_FAILED = "log_failed"

#: What a parse can raise on a line whose fields have the wrong shape: it then becomes an OtherEvent.
_BAD_FIELDS = (KeyError, TypeError, ValueError, OverflowError, AttributeError)


@dataclass(frozen=True, eq=False, kw_only=True)
class Event(Mapping[str, Any]):
    """One line of ``events.jsonl``; read ``e.type``, ``e.step`` and the subclass's fields, or
    ``e["key"]`` as on the line. Build a subclass; parse with :meth:`from_json`."""

    TYPE: ClassVar[str] = ""
    step: int | None = None
    """The training step it happened at (None when the line has none)."""
    time: float | None = None
    """When it was written (the run log stamps it); None before."""
    _json: dict[str, Any] | None = field(default=None, init=False, repr=False)

    @property
    def type(self) -> str:
        return self.TYPE

    def _payload(self) -> dict[str, Any]:
        """The type's own fields under their on-disk keys (``type`` and ``time`` are added)."""
        return {} if self.step is None else {"step": self.step}

    def _fields(self) -> dict[str, Any]:
        if self._json is None:
            out = {"type": self.type, **self._payload()}
            if self.time is not None:
                out["time"] = self.time
            object.__setattr__(self, "_json", out)  # built once: the mapping reads are lookups
            return out
        return self._json

    def to_json(self) -> dict[str, Any]:
        """The line's fields (a fresh dict): as read for a parsed event, as built for a new one."""
        return dict(self._fields())

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        raise NotImplementedError

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Event:
        """The typed event of one parsed line; never raises (see :class:`OtherEvent`)."""
        raw: dict[str, Any] = dict(data) if isinstance(data, Mapping) else {}
        # findings written before events had a "type" are known by their "kind"
        kind = raw.get("type", FINDING if "kind" in raw else None)
        cls = _BY_TYPE.get(kind) if isinstance(kind, str) else None
        event: Event
        try:
            event = cls._parse(raw) if cls is not None else OtherEvent._parse(raw)
        except _BAD_FIELDS:
            event = OtherEvent._parse(raw)
        object.__setattr__(event, "_json", raw)
        return event

    # -- the mapping reads users do on ``load_run(...).events`` ---------------------------------
    def __getitem__(self, key: str) -> Any:
        return self._fields()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields())

    def __len__(self) -> int:
        return len(self._fields())


def _time(raw: Mapping[str, Any]) -> float | None:
    t = raw.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def _int(value: Any) -> int:
    """A step or count from JSON: an int, or a float with no fraction; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a step: {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise ValueError(f"not a step: {value!r}")
    return int(value)


def _opt_int(value: Any) -> int | None:
    try:
        return None if value is None else _int(value)
    except ValueError:
        return None


def _str(raw: Mapping[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str):
        raise ValueError(f"{key} is not text: {value!r}")
    return value


@dataclass(frozen=True, eq=False, kw_only=True)
class FindingEvent(Event):
    """A detector's finding (the payload is the store's :class:`Finding`, as it wrote it)."""

    TYPE: ClassVar[str] = FINDING
    finding: Finding
    step: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "step", self.finding.step)

    def _payload(self) -> dict[str, Any]:
        return self.finding.to_dict()

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        return cls(finding=Finding.from_dict(raw), time=_time(raw))


@dataclass(frozen=True, eq=False, kw_only=True)
class SnapshotTaken(Event):
    """A snapshot was written to ``path`` (relative to the run, or absolute), for ``reason``."""

    TYPE: ClassVar[str] = SNAPSHOT
    step: int
    reason: str
    path: str

    def _payload(self) -> dict[str, Any]:
        return {"step": self.step, "reason": self.reason, "path": self.path}

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        reason = raw.get("reason", "")
        return cls(step=_int(raw["step"]), reason=str(reason), path=_str(raw, "path"), time=_time(raw))


@dataclass(frozen=True, eq=False, kw_only=True)
class SnapshotFailed(Event):
    """A snapshot could not be written; ``error`` says why in plain words."""

    TYPE: ClassVar[str] = SNAPSHOT_FAILED
    step: int
    error: str

    def _payload(self) -> dict[str, Any]:
        return {"step": self.step, "error": self.error}

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        return cls(step=_int(raw["step"]), error=str(raw.get("error", "")), time=_time(raw))


@dataclass(frozen=True, eq=False, kw_only=True)
class StepSkipped(Event):
    """The guard skipped ``optimizer.step()`` (``reason``: "nonfinite" gradients)."""

    TYPE: ClassVar[str] = SKIPPED_STEP
    step: int
    reason: str

    def _payload(self) -> dict[str, Any]:
        return {"step": self.step, "reason": self.reason}

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        return cls(step=_int(raw["step"]), reason=str(raw.get("reason", "")), time=_time(raw))


@dataclass(frozen=True, eq=False, kw_only=True)
class CommandApplied(Event):
    """A monitor's command applied by the training thread at ``step``."""

    TYPE: ClassVar[str] = COMMAND
    step: int
    command: str
    args: Mapping[str, Any] = field(default_factory=dict)

    def _payload(self) -> dict[str, Any]:
        return {"command": self.command, "args": dict(self.args), "step": self.step}

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        # older writers (and the synthetic trainer) named the command "name"
        name = raw["command"] if "command" in raw else raw["name"]
        args = raw.get("args") or {}
        if not isinstance(name, str) or not isinstance(args, Mapping):
            raise ValueError("a command line without a name or with odd arguments")
        return cls(step=_int(raw["step"]), command=name, args=dict(args), time=_time(raw))


@dataclass(frozen=True, eq=False, kw_only=True)
class TrainingError(Event):
    """An exception in the training loop that nnwatch saw pass (``repr`` of it)."""

    TYPE: ClassVar[str] = ERROR
    error: str

    def _payload(self) -> dict[str, Any]:
        return {"step": self.step, "error": self.error}

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        return cls(step=_opt_int(raw.get("step")), error=str(raw.get("error", "")), time=_time(raw))


@dataclass(frozen=True, eq=False, kw_only=True)
class RunEnded(Event):
    """The run ended otherwise than finished: its status and why, as ``end.json`` says them
    (the fields of the probe's ``Ending``, written the same way)."""

    TYPE: ClassVar[str] = RUN_ENDED
    status: str
    reason: str = ""
    exception: str | None = None
    """The exception's type name."""
    message: str | None = None
    exit_code: int | None = None
    signal: str | None = None

    def _payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.signal is not None:
            out["signal"] = self.signal
        if self.exception is not None:
            out["exception"] = {"type": self.exception, "message": self.message or ""}
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        return out

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        exc = raw.get("exception")
        exc = exc if isinstance(exc, Mapping) else {}
        signal = raw.get("signal")
        return cls(
            step=_opt_int(raw.get("step")), status=_str(raw, "status"),
            reason=str(raw.get("reason") or ""),
            exception=None if exc.get("type") is None else str(exc["type"]),
            message=None if exc.get("message") is None else str(exc["message"]),
            exit_code=_opt_int(raw.get("exit_code")),
            signal=None if signal is None else str(signal), time=_time(raw),
        )  # fmt: skip


@dataclass(frozen=True, eq=False, kw_only=True)
class LogFailed(Event):
    """The run log stopped (a full disk, a lost mount): history after this is missing."""

    TYPE: ClassVar[str] = LOG_FAILED
    error: str

    def _payload(self) -> dict[str, Any]:
        return {"error": self.error}

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        return cls(error=str(raw.get("error", "")), time=_time(raw))


@dataclass(frozen=True, eq=False, kw_only=True)
class OtherEvent(Event):
    """A line of a type this nnwatch does not know (a newer writer's), or whose fields have an
    unexpected shape: kept whole, its raw fields readable as ``e["key"]``, never dropped."""

    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def type(self) -> str:
        t = self.fields.get("type")
        return t if isinstance(t, str) else ""

    def _fields(self) -> dict[str, Any]:
        if self._json is None:
            object.__setattr__(self, "_json", dict(self.fields))
        return super()._fields()

    @classmethod
    def _parse(cls, raw: Mapping[str, Any]) -> Event:
        return cls(fields=dict(raw), step=_opt_int(raw.get("step")), time=_time(raw))


_BY_TYPE: dict[str, type[Event]] = {
    c.TYPE: c
    for c in (FindingEvent, SnapshotTaken, SnapshotFailed, StepSkipped, CommandApplied,
              TrainingError, RunEnded, LogFailed)
}  # fmt: skip


def parse_line(line: bytes | str) -> Event | None:
    """One line of ``events.jsonl``: None when it is not a JSON object (the reader counts it)."""
    try:
        data = loads(line)
    except (ValueError, RecursionError):
        return None
    return Event.from_json(data) if isinstance(data, dict) else None


def as_event(event: Mapping[str, Any]) -> Event:
    """``event`` typed: itself when it is one, else its fields parsed (a dict from the wire, a
    test or an older caller)."""
    return event if isinstance(event, Event) else Event.from_json(event)
