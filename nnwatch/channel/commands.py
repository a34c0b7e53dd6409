"""The fixed command set a monitor may send a run, and the one function that validates a request.

Everything that arrives on the command socket goes through :func:`parse_request` before anything
acts on it: bytes in, a normalised :class:`Command` or a :class:`CommandError` with a message a
person can act on. It is pure (no I/O, no state), which is what lets hypothesis fuzz it. Only JSON
is accepted: nothing received is ever unpickled or handed to ``torch.load``.

Wire format, one JSON object per line (newline-delimited JSON)::

    request  {"id": 7, "cmd": "set_clip", "args": {"max_norm": 1.0}}
    reply    {"id": 7, "ok": true, "applies_at_step": 1234, "error": "", "data": {}}

``id`` is optional (an int or a short string) and is echoed back, so a client can match replies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The largest request line accepted, newline included. Commands are tiny; this bounds memory.
MAX_REQUEST_BYTES = 64 * 1024
MAX_ID_CHARS = 64
MAX_NOTE_CHARS = 200
PROTOCOL_VERSION = 1



@dataclass(frozen=True)
class CommandReply:
    """What a run answered to a command: accepted (and the step it applies at) or why not."""

    ok: bool
    applies_at_step: int | None = None
    error: str = ""
    data: dict[str, Any] = field(default_factory=dict)

class CommandError(ValueError):
    """A request that cannot be accepted. ``request_id`` is echoed in the error reply if known."""

    def __init__(self, message: str, request_id: int | str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class Command:
    """A validated request: a known name and arguments of the right types and ranges."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    id: int | str | None = None


# -- argument checkers: each returns the normalised value or raises CommandError --------------


def _number(
    name: str, *, low: float, high: float, allow_none: bool = False
) -> Callable[[Any], Any]:
    def check(value: Any) -> float | None:
        if value is None and allow_none:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            none = " or null (to remove the override)" if allow_none else ""
            raise CommandError(f"{name} must be a number{none}, got {_show(value)}")
        v = float(value)
        if not math.isfinite(v) or not (low < v <= high):
            raise CommandError(f"{name} must be a finite number above {low:g} and at most {high:g}")
        return v

    return check


def _integer(name: str, *, low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise CommandError(f"{name} must be a whole number, got {_show(value)}")
        if not (low <= value <= high):
            raise CommandError(f"{name} must be between {low} and {high}, got {value}")
        return value

    return check


def _text(name: str, *, limit: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise CommandError(f"{name} must be text, got {_show(value)}")
        if len(value) > limit:
            raise CommandError(f"{name} is longer than {limit} characters")
        return value

    return check


def _flag(name: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise CommandError(f"{name} must be true or false, got {_show(value)}")
        return value

    return check


def _start(value: Any) -> str | int:
    if value in ("oldest", "latest"):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62:
        return value
    raise CommandError(f'start must be "oldest", "latest" or a record number, got {_show(value)}')


@dataclass(frozen=True)
class CommandSpec:
    """One command: what it does (for help texts), its arguments, which are required."""

    summary: str
    args: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    #: The argument ``nnwatch ctl RUN COMMAND ARG`` fills from its positional ARG.
    positional: str | None = None
    #: True when the training thread applies it; False when the server answers it on its own.
    applied_by_trainer: bool = True


COMMANDS: dict[str, CommandSpec] = {
    "hello": CommandSpec(
        "describe the run: name, pid, rank, paths, protocol version", applied_by_trainer=False
    ),
    "subscribe": CommandSpec(
        "turn this connection into a stream of history, records, events and status",
        {
            "history": _flag("history"),
            "start": _start,
            "max_hz": _number("max_hz", low=0.0, high=1000.0),
            # resume: only rows after this step, events after this byte of events.jsonl
            "after_step": _number("after_step", low=-1e18, high=1e18, allow_none=True),
            "events_offset": _integer("events_offset", low=0, high=2**62),
            "binary": _flag("binary"),  # rows as length-prefixed raw bytes, not base64
        },
        applied_by_trainer=False,
    ),
    "snapshot": CommandSpec(
        "save model, optimizer and recent records at the next step boundary",
        {"reason": _text("reason", limit=MAX_NOTE_CHARS)},
        positional="reason",
    ),
    "pause": CommandSpec("hold training at the next step boundary until resumed or disconnected"),
    "resume": CommandSpec("let paused training go on"),
    "set_clip": CommandSpec(
        "clip gradients to this global norm from the next step (null: the script's own value)",
        {"max_norm": _number("max_norm", low=0.0, high=1e12, allow_none=True)},
        required=("max_norm",),
        positional="max_norm",
    ),
    "set_layer_interval": CommandSpec(
        "sample per-layer activation stats every n steps",
        {"n": _integer("n", low=1, high=1_000_000)},
        required=("n",),
        positional="n",
    ),
    "anomaly": CommandSpec(
        "run the next steps under torch.autograd.detect_anomaly",
        {"steps": _integer("steps", low=1, high=100_000)},
        positional="steps",
    ),
    "stop": CommandSpec("set w.should_stop so the training loop can end cleanly"),
}


def _show(value: Any) -> str:
    text = json.dumps(value) if _jsonable(value) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def validate(name: Any, args: Any = None, request_id: int | str | None = None) -> Command:
    """Check a command name and its arguments; the same rules for the client and the server."""
    if not isinstance(name, str):
        raise CommandError(f"cmd must be a command name, got {_show(name)}", request_id)
    spec = COMMANDS.get(name)
    if spec is None:
        shown = name if len(name) <= 40 else name[:37] + "..."
        raise CommandError(
            f"unknown command {shown!r}; known commands: {', '.join(COMMANDS)}", request_id
        )
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise CommandError(f"args of {name} must be an object, got {_show(args)}", request_id)
    unknown = [k for k in args if k not in spec.args]
    if unknown:
        accepted = ", ".join(spec.args) or "no arguments"
        raise CommandError(
            f"{name} does not take {_show(str(unknown[0]))}; it accepts {accepted}", request_id
        )
    missing = [k for k in spec.required if k not in args]
    if missing:
        raise CommandError(f"{name} needs {missing[0]}", request_id)
    clean: dict[str, Any] = {}
    for key, value in args.items():
        try:
            clean[key] = spec.args[key](value)
        except CommandError as exc:
            raise CommandError(f"{name}: {exc.message}", request_id) from None
    return Command(name, clean, request_id)


def _reject_constant(token: str) -> Any:
    raise CommandError(f"{token} is not valid JSON")


def parse_request(line: bytes | str) -> Command:
    """Validate one request line. Raises :class:`CommandError` with a plain-words reason."""
    size = len(line.encode() if isinstance(line, str) else line)
    if size > MAX_REQUEST_BYTES:
        raise CommandError(f"message too large ({size} bytes; the limit is {MAX_REQUEST_BYTES})")
    try:
        text = line.decode("utf-8") if isinstance(line, (bytes, bytearray)) else line
        obj = json.loads(text, parse_constant=_reject_constant)
    except CommandError:
        raise
    except UnicodeDecodeError:
        raise CommandError("message is not UTF-8 text; send one JSON object per line") from None
    except RecursionError:
        raise CommandError("message is nested too deeply") from None
    except ValueError as exc:
        raise CommandError(f"message is not valid JSON ({exc}); send one object per line") from None
    if not isinstance(obj, dict):
        raise CommandError(
            f'message must be a JSON object like {{"cmd": "hello"}}, got {_show(obj)}'
        )
    request_id = obj.get("id")
    if request_id is not None and (
        isinstance(request_id, bool)
        or not isinstance(request_id, (int, str))
        or (isinstance(request_id, str) and len(request_id) > MAX_ID_CHARS)
        or (isinstance(request_id, int) and abs(request_id) >= 2**63)
    ):
        raise CommandError(
            f"id must be an integer or a string of at most {MAX_ID_CHARS} characters"
        )
    extra = [k for k in obj if k not in ("id", "cmd", "args")]
    if extra:
        raise CommandError(
            f"unexpected field {_show(str(extra[0]))}; a request has cmd, args and id", request_id
        )
    if "cmd" not in obj:
        raise CommandError('message has no "cmd"; e.g. {"cmd": "hello"}', request_id)
    return validate(obj["cmd"], obj.get("args"), request_id)


def encode_request(command: Command) -> bytes:
    """The request line for a command (the client's side of :func:`parse_request`)."""
    body: dict[str, Any] = {"cmd": command.name, "args": command.args}
    if command.id is not None:
        body["id"] = command.id
    return (json.dumps(body, allow_nan=False) + "\n").encode()


def encode_reply(
    request_id: int | str | None,
    *,
    ok: bool,
    applies_at_step: int | None = None,
    error: str = "",
    data: dict[str, Any] | None = None,
) -> bytes:
    """One reply line. Data that JSON cannot carry (NaN, numpy scalars) is converted, never lost."""
    body = {
        "id": request_id,
        "ok": bool(ok),
        "applies_at_step": applies_at_step,
        "error": error,
        "data": data or {},
    }
    return (json.dumps(body, default=_json_default, allow_nan=True) + "\n").encode()


def _json_default(obj: Any) -> Any:
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return tolist()
    return str(obj)
