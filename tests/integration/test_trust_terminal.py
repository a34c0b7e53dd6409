"""Issue 43, item 10: every string from a run's files is shown, never obeyed, by a terminal.

A run whose name, layer names, events and ``end.json`` (``reason``, ``log_error``: an exception's
message, whatever the failing code put in it) hold escape sequences that would set the
terminal's title, clear the screen and rewrite a line. ``check``, ``ls``, ``show`` and the
monitor (its header and events pane, in Textual's Pilot) print each control character as its
escape (``\\x1b``); before, ``check`` printed them raw and the header carried the ESC bytes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.sources.recorded import RecordedSource
from nnwatch.store.runlog import RunLogWriter
from nnwatch.store.schema import RunMeta, RunSchema
from tests.conftest import REPO

PYTHON = sys.executable
EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[1A\rok\x9b31m\u202e"


def evil_run(root: Path) -> Path:
    run_dir = root / "runs" / f"evil{EVIL}"  # a path printed as it is: the CLI cleans it too
    run_dir.mkdir(mode=0o700, parents=True)
    names = (f"fc{EVIL}", "out")
    meta = RunMeta(name=f"run{EVIL}", schema=RunSchema(names, ("Linear", "Linear"), names, 1),
                   pid=999_999, host=f"host{EVIL}", started=time.time())  # fmt: skip
    writer = RunLogWriter(run_dir, meta)
    rows = np.zeros(20, dtype=meta.schema.record_dtype())
    rows["step"] = np.arange(20)
    rows["loss"] = 1.0
    for r in rows:
        writer.put(r.tobytes())
    writer.events.event({"type": "finding", "kind": "loss_spike", "severity": "warning", "step": 3,
                  "summary": f"summary{EVIL}", "remedy": f"remedy{EVIL}", "evidence": {}})  # fmt: skip
    writer.close("crashed", 20)
    end = json.loads((run_dir / "end.json").read_text())
    end.update(reason=f"RuntimeError: boom{EVIL}", log_error=f"the disk{EVIL}")
    (run_dir / "end.json").write_text(json.dumps(end))
    return run_dir


def cli(*args: str, root: Path) -> str:
    env = dict(os.environ, NNWATCH_RUN_DIR=str(root), PYTHONPATH=str(REPO))
    done = subprocess.run([PYTHON, "-m", "nnwatch", *args], env=env, capture_output=True,
                          timeout=120)  # fmt: skip
    return (done.stdout + done.stderr).decode("utf-8", errors="replace")


def test_check_and_ls_print_escapes_never_control_characters(run_root: Path) -> None:
    run_dir = evil_run(run_root)
    for args in (("check", str(run_dir), "--no-plot"), ("ls", "--all"), ("ls", "--all", "--json")):
        out = cli(*args, root=run_root)
        raw = [c for c in out if ord(c) < 0x20 and c not in "\n\t" or 0x7F <= ord(c) <= 0x9F]
        assert raw == [], (args, out)
        assert "\u202e" not in out, args
    assert "boom\\x1b]0;pwned\\x07" in cli("check", str(run_dir), "--no-plot", root=run_root)


def test_the_monitor_header_and_events_show_escapes(run_root: Path) -> None:
    from nnwatch.testing.tui import fixed_hardware
    from nnwatch.tui.app import NNWatchApp
    from nnwatch.tui.widgets.events import EventsPane
    from nnwatch.tui.widgets.header import RunHeader

    app = NNWatchApp(RecordedSource(evil_run(run_root)), hardware=fixed_hardware, fps=10)
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            for _ in range(50):
                await pilot.pause(0.1)
                if "loss_spike" in app.query_one(EventsPane)._picture.plain:
                    break
            seen["events"] = app.query_one(EventsPane)._picture.plain
            seen["header"] = str(app.query_one(RunHeader).render())
            seen["screen"] = app.export_screenshot()

    asyncio.run(main())
    for where, text in seen.items():
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, where
    assert "run\\x1b]0;pwned" in seen["header"], seen["header"]
    assert "remedy\\x1b]0;pwned" in seen["events"], seen["events"]
