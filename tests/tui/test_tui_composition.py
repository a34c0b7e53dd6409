"""The dashboard by composition: a controller works with the narrow context it declares (no app
needed), and a pane redraws when, and only when, something it draws from changes (the pane
context's reactives), never because the app decided to."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from textual.binding import Binding

from nnwatch.testing.fixture import FixtureSource
from nnwatch.testing.tui import fixed_hardware, settle
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.model import RunState
from nnwatch.tui.steering import Steering
from nnwatch.tui.widgets.base import Outcome, Pane, PaneContext


@dataclass
class Sent:
    commands: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def command(self, name: str, args: dict[str, Any]) -> None:
        self.commands.append((name, args))


class SmallRun:
    """Just what ``SteeredRun`` asks for: the run, its state, its collector."""

    def __init__(self) -> None:
        self.source = FixtureSource(10)
        self.state = RunState(self.source.meta)
        self.collector = Sent()


class SmallHost:
    """Just what ``SteeringHost`` asks for: dialogs, outcomes, keys."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, bool]] = []
        self.screens: list[Any] = []

    def push_screen(self, screen: Any, callback: Any = None) -> None:
        self.screens.append((screen, callback))

    def show_outcome(self, text: str, *, error: bool) -> None:
        self.outcomes.append((text, error))

    def key_of(self, binding: Binding) -> str:
        return "S"  # as if the user had moved the snapshot key


def test_steering_needs_only_its_narrow_host() -> None:
    host, run = SmallHost(), SmallRun()
    ctx = PaneContext(run.state, run.source)
    steering = Steering(host, run, ctx)  # type: ignore[arg-type]  # a FixtureSource stands for a RunSource
    steering.steer("snapshot")
    assert run.collector.commands == [("snapshot", {"reason": "key S in nnwatch"})]
    assert ctx.outcome == Outcome("snapshot: sent, waiting for the trainer…")
    steering.steer("pause")  # asks first: a dialog, nothing sent yet
    (screen, answer), = host.screens
    assert "Pause training" in str(screen.question) and len(run.collector.commands) == 1
    answer(False)
    assert host.outcomes == [("pause cancelled", False)]


def test_a_pane_names_only_reactives_of_the_pane_context() -> None:
    with pytest.raises(TypeError, match="zoom"):

        class Typo(Pane):  # noqa: F841 - defining it is the test
            redraw_on = frozenset({"zoom"})


def test_a_view_key_redraws_only_the_panes_that_draw_from_it() -> None:
    app = NNWatchApp(FixtureSource(500), hardware=None, fps=10)

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app, 500)
            panes = {p.id: p for p in app.dashboard.panes}
            before = {k: p.redraws for k, p in panes.items()}
            await pilot.press("z")  # the charts and the AMP pane draw from `zoomed`
            await pilot.pause()
            grew = {k for k, p in panes.items() if p.redraws > before[k]}
            assert {"loss", "grad", "amp"} <= grew
            assert not grew & {"header", "events", "gpu", "layers"}, grew
            before = {k: p.redraws for k, p in panes.items()}
            app.ctx.layer_filter = "fc"  # as typing in the filter does
            await pilot.pause()
            grew = {k for k, p in panes.items() if p.redraws > before[k]}
            assert {"header", "layers"} <= grew and not grew & {"loss", "grad", "events"}, grew

    asyncio.run(main())


def test_new_data_redraws_the_panes_of_its_topics_only() -> None:
    app = NNWatchApp(FixtureSource(500), hardware=fixed_hardware, fps=10)

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app, 500)
            panes = {p.id: p for p in app.dashboard.panes}
            before = {k: p.redraws for k, p in panes.items()}
            app.state.mark_changed("events")
            app.refresh_panes()  # the redraw tick
            await pilot.pause()
            assert panes["events"].redraws == before["events"] + 1
            assert panes["loss"].redraws == before["loss"]

    asyncio.run(main())
