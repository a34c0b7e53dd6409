"""The stacks pane: where each rank of a stuck job is, in the job view.

While the job moves it is hidden. Once ranks wait in a collective or
make no step for many times their usual step time, the job view's source asks every rank for its
Python stacks (``nnwatch.sources.job_stacks``) and this pane draws them: first the ranks that
did not answer (stopped, or holding the GIL), then each stack shared by a group of ranks, largest
first, with its ranks in ranges and its innermost call, then its frames as a traceback shows
them (innermost last). ``nnwatch stacks JOB`` prints the same.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Group
from rich.style import Style
from rich.text import Text
from textual.app import RenderResult

from nnwatch.channel.stacks import format_thread
from nnwatch.sources.job_stacks import group, span
from nnwatch.tui.widgets.base import Pane

#: Frames shown per group (the innermost: where it waits); the rest are counted.
FRAMES_SHOWN = 8


class StacksPane(Pane):
    key = "stacks"

    DEFAULT_CSS = """
    StacksPane {
        height: auto;
        max-height: 50%;
    }
    """

    def __init__(self, ctx: Any, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(ctx, id=id, classes=classes)
        self.view: Any = None  # the latest JobView
        self.border_title = "stacks"

    def show(self, view: Any) -> None:
        """Take a new job view (UI thread) and draw it; shown only while there are stacks."""
        self.view = view
        self.display = bool(getattr(view, "stacks", ()))
        self.redraw()
        self.refresh(layout=True)  # its height follows its lines

    def build(self) -> RenderResult:
        pal = self.ctx.palette
        stacks = tuple(getattr(self.view, "stacks", ()) or ())
        if not stacks:
            self.border_subtitle = ""
            return Text("the job is moving: every rank's stacks appear here when it gets stuck "
                        "(`nnwatch stacks JOB` asks now)", style=pal.muted)  # fmt: skip
        taken = [s.taken_at for s in stacks if math.isfinite(s.taken_at)]
        when = time.strftime("%H:%M:%S", time.localtime(max(taken))) if taken else "?"
        answered = sum(1 for s in stacks if not s.error)
        self.border_subtitle = f"{answered}/{len(stacks)} ranks answered at {when}"
        lines: list[Text] = []
        for s in stacks:
            if s.error:
                lines.append(Text(f"rank {s.rank}: {s.error}", style=pal.error + Style(bold=True)))
        for g in group(stacks):
            head = Text()
            head.append(span(g.ranks), style=pal.accent + Style(bold=True))
            head.append(f" · {g.thread.get('name', '?')} · ", style=pal.muted)
            head.append(g.where, style=pal.text + Style(bold=True))
            lines.append(head)
            frames = list(g.thread.get("frames") or [])
            if len(frames) > FRAMES_SHOWN:
                lines.append(Text(f"    … {len(frames) - FRAMES_SHOWN} outer frames", style=pal.muted))
            shown = {**g.thread, "frames": frames[-FRAMES_SHOWN:]}
            body = format_thread(shown, "  ")[1:]  # the thread's name is in the head line
            lines += [Text(line, style=pal.text if line.lstrip().startswith("File") else pal.muted)
                      for line in body]  # fmt: skip
        return Group(*lines)
