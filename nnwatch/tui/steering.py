"""The keys that steer training (snapshot, pause, clip, anomaly: every command the spec gives a
key): each goes through ``source.command`` in a thread and says what happened ("clip 1.0 applies
at step 1234"), or why it could not.

The keys themselves come from the command spec (``bindings.py``); every one calls ``action_steer``
with its command's name. A few commands have an exchange of their own here (pause toggles with
resume, clip asks for the norm); any other keyed command asks first and is sent without arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from textual.binding import Binding

from nnwatch.channel.commands import ANOMALY, COMMANDS, PAUSE, RESUME, SET_CLIP, SNAPSHOT
from nnwatch.sources.base import RunSource
from nnwatch.store.schema import FieldName
from nnwatch.tui import format as fmt
from nnwatch.tui.bindings import STEERING_BINDINGS, steer_action
from nnwatch.tui.collectors import SourceCollector
from nnwatch.tui.host import ScreenPusher
from nnwatch.tui.messages import CommandFinished
from nnwatch.tui.model import RunState
from nnwatch.tui.screens.dialogs import ClipScreen, ConfirmScreen
from nnwatch.tui.widgets.base import Outcome, PaneContext

#: The commands with an exchange (or an outcome line) of their own in the TUI.
CMD_SNAPSHOT, CMD_PAUSE, CMD_RESUME, CMD_CLIP, CMD_ANOMALY = SNAPSHOT, PAUSE, RESUME, SET_CLIP, ANOMALY


class SteeredRun(Protocol):
    """The main run steering sends to (the app's feeds: it changes with a rank switch or a
    swap, so it is read at each key): its source, its state, and the collector that owns it."""

    @property
    def source(self) -> RunSource: ...

    @property
    def state(self) -> RunState: ...

    @property
    def collector(self) -> SourceCollector: ...


class SteeringHost(ScreenPusher, Protocol):
    """What steering needs of the app: dialogs, the outcome line, and the keys as the user
    mapped them."""

    def show_outcome(self, text: str, *, error: bool) -> None: ...

    def key_of(self, binding: Binding) -> str: ...


class Steering:
    """Commands to the trainer, and their answers."""

    def __init__(self, host: SteeringHost, run: SteeredRun, ctx: PaneContext) -> None:
        self.host = host
        self.run = run
        self.ctx = ctx

    def _send(self, name: str, **args: Any) -> None:
        self.ctx.outcome = Outcome(f"{name}: sent, waiting for the trainer…")
        self.run.collector.command(name, args)

    def finished(self, message: CommandFinished) -> None:
        reply, name = message.reply, message.name
        args = dict(message.args)
        if reply.ok:
            text = describe_outcome(name, args, reply.applies_at_step, reply.data)
            self.host.show_outcome(text, error=False)
        else:
            self.host.show_outcome(
                f"{name} failed: {reply.error or 'no answer from the run'}", error=True
            )

    def steer(self, name: str) -> None:
        """A steering key: its command's own exchange if it has one, else ask and send."""
        own: dict[str, Callable[[], None]] = {
            CMD_SNAPSHOT: self._request_snapshot,
            CMD_PAUSE: self._toggle_pause,
            CMD_CLIP: self._set_clip,
            CMD_ANOMALY: self._arm_anomaly,
        }
        exchange = own.get(name)
        if exchange is not None:
            exchange()
        else:
            self._ask_and_send(name)

    def _current_key(self, name: str) -> str:
        """The key that sends ``name`` now, after the user's keymap."""
        for b in STEERING_BINDINGS:
            if b.action == steer_action(name):
                return self.host.key_of(b)
        return "?"

    def _request_snapshot(self) -> None:
        self._send(CMD_SNAPSHOT, reason=f"key {self._current_key(CMD_SNAPSHOT)} in nnwatch")

    def _toggle_pause(self) -> None:
        paused = self.run.state.status.state == "paused"
        verb = "Resume" if paused else "Pause"
        detail = (
            "Training continues from where it stopped."
            if paused
            else "The trainer stops at the next step boundary and waits; closing nnwatch resumes it."
        )

        def answer(yes: bool | None) -> None:
            if yes:
                self._send(CMD_RESUME if paused else CMD_PAUSE)
            else:
                self.host.show_outcome(f"{verb.lower()} cancelled", error=False)

        self.host.push_screen(
            ConfirmScreen(f"{verb} training of {self.run.source.meta.name}?", detail), answer
        )

    def _set_clip(self) -> None:
        current = self.run.state.history.latest_finite(FieldName.CLIP_THRESHOLD)

        def got_value(value: float | None) -> None:
            if value is None:
                self.host.show_outcome("clip unchanged", error=False)
                return

            def answer(yes: bool | None) -> None:
                if yes:
                    self._send(CMD_CLIP, max_norm=value)
                else:
                    self.host.show_outcome("clip unchanged", error=False)

            self.host.push_screen(
                ConfirmScreen(
                    f"Clip gradients of {self.run.source.meta.name} at max norm {value:g}?",
                    "It applies from the next optimizer step, and shows in the records.",
                ),
                answer,
            )

        self.host.push_screen(ClipScreen(current), got_value)

    def _arm_anomaly(self) -> None:
        self._send(CMD_ANOMALY, steps=1)

    def _ask_and_send(self, name: str) -> None:
        """A keyed command without an exchange of its own: confirm with its summary, then send it
        without arguments (one that needs some says how to send it with ``nnwatch ctl``)."""
        spec = COMMANDS.get(name)
        if spec is None:
            self.host.show_outcome(f"{name}: not a command this nnwatch knows", error=True)
            return
        if spec.required:
            self.host.show_outcome(
                f"{name} needs {', '.join(spec.required)}; send it with "
                f"`nnwatch ctl {self.run.source.meta.name} {spec.usage(name)}`",
                error=True,
            )
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self._send(name)
            else:
                self.host.show_outcome(f"{name} cancelled", error=False)

        self.host.push_screen(
            ConfirmScreen(f"Send {name} to {self.run.source.meta.name}?", spec.summary), answer
        )


def describe_outcome(
    name: str, args: dict[str, Any], step: int | None, data: dict[str, Any]
) -> str:
    at = f" at step {fmt.count(step)}" if step is not None else ""
    if name == CMD_CLIP:
        return f"clip {args.get('max_norm'):g} applies{at or ' at the next step'}"
    if name == CMD_SNAPSHOT:
        path = data.get("path")
        return f"snapshot{at}" + (f": {path}" if path else " requested")
    if name == CMD_PAUSE:
        return f"paused{at}"
    if name == CMD_RESUME:
        return f"resumed{at}"
    if name == CMD_ANOMALY:
        return f"anomaly mode armed for the next step{at and ' (' + at.strip() + ')'}"
    return f"{name} applied{at}"
