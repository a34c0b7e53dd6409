"""The fixed command set a monitor may send a run, and the one function that validates a request.

Everything that arrives on the command socket goes through :func:`parse_request` before anything
acts on it: bytes in, a normalised :class:`Command` or a :class:`CommandError` with a message a
person can act on. It is pure (no I/O, no state), which is what lets hypothesis fuzz it. Only JSON
is accepted: nothing received is ever unpickled or handed to ``torch.load``.

Wire format, one JSON object per line (newline-delimited JSON)::

    request  {"id": 7, "cmd": "set_clip", "args": {"max_norm": 1.0}}
    reply    {"id": 7, "ok": true, "applies_at_step": 1234, "error": "", "data": {}}

``id`` is optional (an int or a short string) and is echoed back, so a client can match replies.

:data:`COMMANDS` is the one specification of the command set: each :class:`CommandSpec` says what
the command does, its arguments (type, range, help, how ``nnwatch ctl`` reads one from the command
line), who applies it (the server thread at once, or the training thread at a step boundary), how
often the run takes it, and the TUI key that sends it (with its footer word and help line). The
server's validation, the client's request building, ``nnwatch ctl``'s help and parsing, the
probe's dispatch table and the TUI's steering keys all derive from it; adding a command is adding
one entry here (and its handler where it is applied).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

#: The largest request line accepted, newline included. Commands are tiny; this bounds memory.
MAX_REQUEST_BYTES = 64 * 1024
MAX_ID_CHARS = 64
MAX_NOTE_CHARS = 200
PROTOCOL_VERSION = 1
#: The commands that take, renew and lift a pause held by the connection that asked (the rule is
#: in :mod:`nnwatch.channel.pause`).
PAUSE, RESUME, RENEW = "pause", "resume", "renew"
#: Every thread's Python stack, answered by the server thread (a trainer blocked in C answers).
STACKS = "stacks"
#: The run's description, answered by the server thread.
HELLO = "hello"
#: The other commands' names, one constant each: every part that names a command uses these.
SNAPSHOT, SET_CLIP, SET_LAYER_INTERVAL, ANOMALY, STOP = (
    "snapshot", "set_clip", "set_layer_interval", "anomaly", "stop",
)


@dataclass(frozen=True)
class CommandReply:
    """What a run answered to a command: accepted (and the step it applies at) or why not."""

    ok: bool
    applies_at_step: int | None = None
    error: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    #: Sent, but no reply came in time: the run may still apply it at its next step boundary.
    pending: bool = False


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


# -- command-line text to argument values (``nnwatch ctl RUN COMMAND ARG``) ---------------------


def _from_text_number_or_off(text: str) -> float | None:
    if text.lower() in ("off", "none", "null", "default"):
        return None
    try:
        return float(text)
    except ValueError:
        raise CommandError(f"needs a number or 'off', got {text!r}") from None


def _from_text_integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"needs a whole number, got {text!r}") from None


@dataclass(frozen=True)
class Arg:
    """One argument: its checker (returns the normalised value or raises CommandError), a help
    text, and how a command line's text becomes the value the checker takes."""

    check: Callable[[Any], Any]
    help: str = ""
    from_text: Callable[[str], Any] = str
    #: How help texts show the command-line value, e.g. ``N`` or ``NORM|off``.
    metavar: str = "TEXT"

    def __call__(self, value: Any) -> Any:
        return self.check(value)


@dataclass(frozen=True)
class CommandSpec:
    """One command: what it does (for help texts), its arguments, which are required, who applies
    it, how often, and the TUI key that sends it. ``args`` values may be :class:`Arg` or plain
    checkers (wrapped into an ``Arg``)."""

    summary: str
    args: dict[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    #: The argument ``nnwatch ctl RUN COMMAND ARG`` fills from its positional ARG.
    positional: str | None = None
    #: True when the training thread applies it; False when the server answers it on its own.
    applied_by_trainer: bool = True
    #: The TUI key that sends it, if any: the dashboard's binding for it comes from these four.
    key: str | None = None
    #: The key's word in the footer (default: the command name).
    key_label: str = ""
    #: The key's line in the ``?`` help (default: ``summary``).
    key_help: str = ""
    #: The binding id a user's keymap moves the key by (default: the command name).
    key_id: str = ""
    #: At most this many per second from all monitors together; more are refused with the reason
    #: (for commands whose every use costs the trainer real work, like a snapshot).
    per_s: float | None = None
    #: Why ``nnwatch ctl`` does not send it (empty: it does).
    not_for_ctl: str = ""
    #: The connection that sends it becomes something else (a stream): no reply line follows.
    takes_connection: bool = False

    def __post_init__(self) -> None:
        wrapped = {k: v if isinstance(v, Arg) else Arg(v) for k, v in self.args.items()}
        object.__setattr__(self, "args", wrapped)

    @property
    def applied_by(self) -> str:
        """Who applies it: "trainer" (at the next step boundary) or "server" (at once)."""
        return "trainer" if self.applied_by_trainer else "server"

    def usage(self, name: str) -> str:
        """``set_clip NORM|off``: the command as ``nnwatch ctl`` takes it."""
        if self.positional is None:
            return name
        return f"{name} {self.args[self.positional].metavar}"

    def from_text(self, name: str, text: str | None) -> dict[str, Any]:
        """The arguments for a command line's optional ARG, with plain-words errors."""
        if text is None:
            return {}
        if self.positional is None:
            raise CommandError(f"{name} takes no argument (got {text!r})")
        try:
            value = self.args[self.positional].from_text(text)
        except CommandError as exc:
            raise CommandError(f"{name} {exc.message}") from None
        return {self.positional: value}


COMMANDS: dict[str, CommandSpec] = {
    HELLO: CommandSpec(
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
            # a far monitor: summaries sized to its screen, recent rows, live aggregates
            "overview": _flag("overview"),
            "buckets": _integer("buckets", low=16, high=65536),
            "window": _integer("window", low=0, high=1_000_000),
            "live_points": _number("live_points", low=0.0, high=1e6),
        },
        applied_by_trainer=False,
        not_for_ctl="subscribe is for monitors; use `nnwatch attach`",
        takes_connection=True,
    ),
    SNAPSHOT: CommandSpec(
        "save model, optimizer and recent records at the next step boundary",
        {
            "reason": Arg(
                _text("reason", limit=MAX_NOTE_CHARS),
                "why, kept with the snapshot",
                metavar="REASON",
            )
        },
        positional="reason",
        key="s",
        key_label="snap",
        key_help="write a snapshot now",
        per_s=1.0,
    ),
    PAUSE: CommandSpec(
        "hold training at the next step boundary until resumed (the asker renews it)",
        key="p",
        key_help="pause or resume training (asks first)",
    ),
    RESUME: CommandSpec("let paused training go on"),
    RENEW: CommandSpec(
        "renew the pause this connection holds; the reply says whether it still holds one",
        applied_by_trainer=False,
        not_for_ctl="`nnwatch ctl RUN pause` renews the pause it holds by itself",
    ),
    STACKS: CommandSpec(
        "every thread's Python stack, answered at once (also while training is blocked in C)",
        applied_by_trainer=False,
    ),
    SET_CLIP: CommandSpec(
        "clip gradients to this global norm from the next step (off: the script's own value)",
        {
            "max_norm": Arg(
                _number("max_norm", low=0.0, high=1e12, allow_none=True),
                "the global norm; null (off) removes the override",
                from_text=_from_text_number_or_off,
                metavar="NORM|off",
            )
        },
        required=("max_norm",),
        positional="max_norm",
        key="c",
        key_label="clip",
        key_help="set the grad clip threshold (asks first)",
        key_id="clip",
    ),
    SET_LAYER_INTERVAL: CommandSpec(
        "sample per-layer activation stats every N steps",
        {
            "n": Arg(
                _integer("n", low=1, high=1_000_000),
                "steps between full per-layer stats",
                from_text=_from_text_integer,
                metavar="N",
            )
        },
        required=("n",),
        positional="n",
    ),
    ANOMALY: CommandSpec(
        "run the next STEPS steps (default 1) under torch.autograd.detect_anomaly",
        {
            "steps": Arg(
                _integer("steps", low=1, high=100_000),
                "how many steps",
                from_text=_from_text_integer,
                metavar="STEPS",
            )
        },
        positional="steps",
        key="a",
        key_label="anom",
        key_help="anomaly detection for the next step",
        per_s=1.0,
    ),
    STOP: CommandSpec("set w.should_stop so the training loop can end cleanly"),
}


def keyed_commands() -> dict[str, CommandSpec]:
    """The commands the TUI sends from a key, by name (``spec.key`` is the default key)."""
    return {name: spec for name, spec in COMMANDS.items() if spec.key is not None}


def applied_by(where: str) -> Iterator[str]:
    """Names of the commands applied by the "trainer" or by the "server"."""
    return (name for name, spec in COMMANDS.items() if spec.applied_by == where)


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
