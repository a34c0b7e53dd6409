"""The dashboard's steering keys come from the command spec: a command given a key there gets its
binding, footer word and help line without a TUI edit, and pressing it asks first and sends it to
a real (synthetic) trainer over the real socket."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nnwatch.channel.commands import COMMANDS, keyed_commands
from nnwatch.tui.app import STEERING, NNWatchApp
from nnwatch.tui.bindings import steer_action, steering_bindings

REPO = Path(__file__).resolve().parents[2]


def test_every_keyed_command_has_its_binding_and_no_key_is_taken_twice() -> None:
    by_action = {b.action: b for b in NNWatchApp.BINDINGS}
    for name, spec in keyed_commands().items():
        b = by_action[steer_action(name)]
        assert (b.key, b.description, b.id) == (spec.key, spec.key_label or name, spec.key_id or name)  # fmt: skip
        assert b.tooltip == (spec.key_help or spec.summary)
        assert b.action in STEERING
    # what users see and remap stays as it was: the footer words and binding ids of the four keys
    steering = [(b.key, b.description, b.id) for b in NNWatchApp.BINDINGS if b.action in STEERING]
    assert steering == [
        ("s", "snap", "snapshot"), ("p", "pause", "pause"), ("c", "clip", "clip"), ("a", "anom", "anomaly"),
    ]  # fmt: skip
    keys = [k for b in NNWatchApp.BINDINGS for k in b.key.split(",")]
    ids = [b.id for b in NNWatchApp.BINDINGS]
    assert len(keys) == len(set(keys)) and len(ids) == len(set(ids))


def test_a_key_added_to_the_spec_becomes_a_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not any(b.id == "stop" for b in steering_bindings())
    monkeypatch.setitem(COMMANDS, "stop", dataclasses.replace(COMMANDS["stop"], key="k"))
    (b,) = [b for b in steering_bindings() if b.id == "stop"]
    assert (b.key, b.action, b.description, b.tooltip) == (
        "k", steer_action("stop"), "stop", COMMANDS["stop"].summary,
    )  # fmt: skip


# Runs in its own interpreter: the spec gains keys before the TUI is imported, as an edit of
# commands.py would; then the real app follows a live synthetic trainer under Pilot.
_APP = r"""
import asyncio, dataclasses, json, sys
from nnwatch.channel.commands import COMMANDS
COMMANDS["stop"] = dataclasses.replace(COMMANDS["stop"], key="k")
COMMANDS["set_layer_interval"] = dataclasses.replace(COMMANDS["set_layer_interval"], key="K")
from nnwatch.sources.live import LiveSource
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.screens.dialogs import ConfirmScreen
from nnwatch.tui.screens.help import HelpScreen
from nnwatch.testing.tui import fixed_hardware, settle, wait_until

app = NNWatchApp(LiveSource.find(sys.argv[1]), hardware=fixed_hardware, fps=10)
seen = {}

async def main():
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, rows=3, timeout=60)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.query_one("#help-table")
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        seen["help"] = {r[1]: [str(r[0]), str(r[2])] for r in rows}
        await pilot.press("escape")
        await pilot.press("K")  # needs an argument the TUI has no dialog for
        await pilot.pause()
        seen["needs"] = app.outcomes[-1]
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmScreen)
        seen["asked"] = str(app.screen.query_one(".title").render())
        await pilot.press("y")
        await wait_until(pilot, lambda: any(o.startswith("stop ") for o in app.outcomes), 30)
        seen["outcome"] = app.outcomes[-1]
        await pilot.press("q")

asyncio.run(main())
print(json.dumps(seen))
"""


def test_a_keyed_command_without_a_tui_exchange_asks_then_reaches_the_trainer(
    subprocess_env: dict[str, str],
) -> None:
    trainer = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic", "--steps", "0", "--rate", "50", "--name", "keyed"],
        env=subprocess_env, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert trainer.stdout is not None
        ready = json.loads(trainer.stdout.readline())
        app = subprocess.run(
            [sys.executable, "-c", _APP, ready["run_dir"]],
            env=subprocess_env, capture_output=True, text=True, cwd=REPO, timeout=180,
        )  # fmt: skip
        assert app.returncode == 0, app.stderr[-3000:]
        seen = json.loads(app.stdout.strip().splitlines()[-1])
        assert seen["help"]["stop"] == ["k", COMMANDS["stop"].summary]
        assert seen["help"]["set_layer_interval"][0] == "K"
        assert seen["needs"].startswith("set_layer_interval needs n; send it with `nnwatch ctl")
        assert seen["needs"].endswith("set_layer_interval N`")
        assert seen["asked"] == "Send stop to keyed?"
        assert seen["outcome"].startswith("stop applied at step")
        done = json.loads(trainer.stdout.readline())  # the trainer ended because of the key
        assert done["done"] and done["status"] == "stopped"
        assert trainer.wait(timeout=30) == 0
    finally:
        trainer.kill()
        trainer.wait()
