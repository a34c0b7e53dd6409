"""The keys that steer training (``s`` snapshot, ``p`` pause, ``c`` clip, ``a`` anomaly): each one
that changes training asks first, goes through ``source.command`` in a thread, and says what
happened ("clip 1.0 applies at step 1234"), or why it could not."""

from __future__ import annotations

from typing import Any

from nnwatch.tui import format as fmt
from nnwatch.tui.messages import CommandFinished
from nnwatch.tui.monitor import MonitorBase
from nnwatch.tui.screens.dialogs import ClipScreen, ConfirmScreen

#: Commands sent to the trainer. Names match the live channel's command set.
CMD_SNAPSHOT, CMD_PAUSE, CMD_RESUME, CMD_CLIP, CMD_ANOMALY = (
    "snapshot",
    "pause",
    "resume",
    "set_clip",
    "anomaly",
)


class SteeringActions(MonitorBase):
    """Commands to the trainer, and their answers."""

    def _send(self, name: str, **args: Any) -> None:
        self.view.outcome = f"{name}: sent, waiting for the trainer…"
        self.view.outcome_error = False
        self.state.touch("header")
        self.refresh_panes()
        self.collector.command(name, args)

    def on_command_finished(self, message: CommandFinished) -> None:
        reply, name = message.reply, message.name
        args = dict(message.args)
        if reply.ok:
            text = describe_outcome(name, args, reply.applies_at_step, reply.data)
            self._show_outcome(text, error=False)
        else:
            self._show_outcome(
                f"{name} failed: {reply.error or 'no answer from the run'}", error=True
            )

    def action_request_snapshot(self) -> None:
        self._send(CMD_SNAPSHOT, reason="key s in nnwatch")

    def action_toggle_pause(self) -> None:
        paused = self.state.status.state == "paused"
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
                self._show_outcome(f"{verb.lower()} cancelled", error=False)

        self.push_screen(
            ConfirmScreen(f"{verb} training of {self.source.meta.name}?", detail), answer
        )

    def action_set_clip(self) -> None:
        current = self.state.history.latest_finite("clip_threshold")

        def got_value(value: float | None) -> None:
            if value is None:
                self._show_outcome("clip unchanged", error=False)
                return

            def answer(yes: bool | None) -> None:
                if yes:
                    self._send(CMD_CLIP, max_norm=value)
                else:
                    self._show_outcome("clip unchanged", error=False)

            self.push_screen(
                ConfirmScreen(
                    f"Clip gradients of {self.source.meta.name} at max norm {value:g}?",
                    "It applies from the next optimizer step, and shows in the records.",
                ),
                answer,
            )

        self.push_screen(ClipScreen(current), got_value)

    def action_arm_anomaly(self) -> None:
        self._send(CMD_ANOMALY, steps=1)


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
