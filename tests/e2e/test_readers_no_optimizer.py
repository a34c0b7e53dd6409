"""Every reader on runs that have zero-width fields: ``optimizer=None`` (no LR group), a model
whose only modules are an LSTM and a Linear, models with no watched layer at all.

The runs are made by real training loops in subprocesses (``nnwatch.watch`` with a hand-written
SGD update, ``w.step(loss)`` once per step) and read back through every way a user has: the
dashboard on the run log (``nnwatch open``), the dashboard on the live trainer (``nnwatch
attach``), ``nnwatch export tensorboard`` and ``nnwatch.load_run``. The 0-column ``lr`` array
once killed the monitor's collector thread, which left the dashboard on CONNECTING for ever.
"""

from __future__ import annotations

import asyncio
import math
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.pilot import Pilot

import nnwatch
from nnwatch.sources.base import RunSource
from nnwatch.sources.live import LiveSource
from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.fixture import FixtureSource, write_run
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.model import RunState
from nnwatch.tui.widgets.base import Pane
from nnwatch.tui.widgets.header import RunHeader
from nnwatch.tui.widgets.layers import LayersPane
from nnwatch.tui.widgets.loss import LossPane
from tests.conftest import REPO

#: A training script as users write it without an optimizer object: a manual SGD update.
TRAINER = r"""
import sys, time
import torch
from torch import nn
import nnwatch

kind, steps, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
torch.set_num_threads(1)
torch.manual_seed(0)


class LstmHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


if kind == "lstm":
    model = LstmHead()
else:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
lr = 0.05
with nnwatch.watch(model, None, num_classes=3, name=f"manual-{kind}") as w:
    print("run_dir", w.run_dir, flush=True)
    for i in range(steps):
        x = torch.randn(4, 5, 8) if kind == "lstm" else torch.randn(4, 8)
        y = torch.randint(0, 3, (4,))
        for p in model.parameters():
            p.grad = None
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
        w.step(loss)
        if delay:
            time.sleep(delay)
print("done", flush=True)
"""

Body = Callable[[Pilot[Any], NNWatchApp], Awaitable[None]]


def _env(root: Path) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.update(
        NNWATCH_RUN_DIR=str(root),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def _train(root: Path, kind: str, steps: int) -> Path:
    out = subprocess.run(
        [sys.executable, "-c", TRAINER, kind, str(steps), "0"],
        cwd=REPO,
        env=_env(root),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("run_dir "))
    return Path(line.split(maxsplit=1)[1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two finished runs with optimizer=None: an MLP, and a model of only an LSTM + a Linear."""
    root = tmp_path_factory.mktemp("manual-runs")
    return {kind: _train(root, kind, 150) for kind in ("mlp", "lstm")}


def drive(app: NNWatchApp, body: Body, size: tuple[int, int] = (160, 48)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await body(pilot, app)

    asyncio.run(main())


def make_app(source: RunSource) -> NNWatchApp:
    return NNWatchApp(source, hardware=fixed_hardware, fps=10)


def pane_text(pane: Pane) -> str:
    from textual.geometry import Region

    return "\n".join(
        s.text for s in pane.render_lines(Region(0, 0, pane.region.width, pane.region.height))
    )


@pytest.mark.parametrize("kind", ["mlp", "lstm"])
def test_open_shows_the_loss_of_a_run_trained_without_an_optimizer(
    runs: dict[str, Path], kind: str
) -> None:
    """``nnwatch open RUN_DIR`` on a real optimizer=None run: the loss, not CONNECTING."""
    run_dir = runs[kind]
    losses = nnwatch.load_run(run_dir)["loss"]
    src = RecordedSource(run_dir)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await wait_until(pilot, lambda: app.state.history.rows == len(losses), timeout=20)
        await settle(pilot, app)
        header = pane_text(app.query_one(RunHeader))
        assert "CONNECTING" not in header and "FINISHED" in header
        assert "step 149" in header
        loss = pane_text(app.query_one(LossPane))
        assert f"Loss {_num(float(losses[-1]))}" in loss
        assert "no data yet" not in loss
        assert not app.state.reader_errors
        assert [p.key for p in app.query(Pane) if p.draw_error] == []
        await pilot.press("home", "right", "right", "z", "end")  # scrub: still answers
        assert app.ctx.cursor is None

    drive(make_app(src), body)


def _num(x: float) -> str:
    from nnwatch.tui import format as fmt

    return fmt.num(x)


def test_the_lstm_run_lists_its_linear_layer_and_lstm_gradients(runs: dict[str, Path]) -> None:
    run = nnwatch.load_run(runs["lstm"])
    schema = run.meta.schema
    assert schema.num_lr == 0
    assert "lstm" in schema.param_layer_names and "head" in schema.layer_names

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, len(run))
        layers = app.query_one(LayersPane)
        assert layers.shown_rows == list(schema.layer_names)
        assert "Layers" in pane_text(layers)

    drive(make_app(RecordedSource(runs["lstm"])), body)


def test_load_run_reads_a_run_without_optimizer(runs: dict[str, Path]) -> None:
    for kind, run_dir in runs.items():
        run = nnwatch.load_run(run_dir)
        assert run.status == "finished", kind
        assert len(run) == 150
        assert run["lr"].shape == (150, 0)  # no LR group: an empty column, not a made-up 0
        assert np.isfinite(run["loss"]).all()
        assert np.isfinite(run["grad_norm"]).any()
        steps, values = run.layer_stat("grad_layer", run.meta.schema.param_layer_names[0])
        assert len(steps) == len(values) >= 1


@pytest.mark.parametrize("kind", ["mlp", "lstm"])
def test_export_tensorboard_of_a_run_without_optimizer(
    runs: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = runs[kind]
    out = subprocess.run(
        [sys.executable, "-m", "nnwatch", "export", "tensorboard", str(run_dir), str(tmp_path)],
        cwd=REPO,
        env=_env(run_dir.parent.parent),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "150 steps" in out.stdout
    acc = EventAccumulator(str(tmp_path / run_dir.name), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert not [t for t in tags if t.startswith("train/lr")]  # no LR group, no LR curve
    loss = [e.value for e in acc.Scalars("train/loss")]
    expected = nnwatch.load_run(run_dir)["loss"]
    np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_attach_follows_a_live_run_without_optimizer(tmp_path: Path, run_root: Path) -> None:
    """``nnwatch attach`` on a trainer still running with optimizer=None: LIVE, with its loss."""
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, "mlp", "100000", "0.01"],
        cwd=REPO,
        env=_env(run_root),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("run_dir "), line
        run_dir = Path(line.split(maxsplit=1)[1].strip())
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        while True:  # the registry entry and the ring appear with the first steps
            try:
                source = LiveSource.find(str(run_dir))
                if source.ring_path.exists():
                    break
                source.close()
            except Exception:  # noqa: BLE001 - not registered yet
                pass
            assert time.monotonic() < deadline, "the trainer never registered"
            time.sleep(0.2)

        async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
            await wait_until(pilot, lambda: app.state.history.rows >= 30, timeout=40)
            first = app.state.history.last_step
            await wait_until(pilot, lambda: app.state.history.last_step > first + 5, timeout=40)
            await settle(pilot, app)
            header = pane_text(app.query_one(RunHeader))
            assert "LIVE" in header and "CONNECTING" not in header
            latest = app.state.value_at("loss", None)
            assert math.isfinite(latest)
            assert "Loss " in pane_text(app.query_one(LossPane))
            assert "no data yet" not in pane_text(app.query_one(LossPane))
            assert not app.state.reader_errors

        drive(NNWatchApp(source, hardware=fixed_hardware, fps=10), body)
    finally:
        proc.kill()
        proc.wait(timeout=30)


# -- the same zero-width fields, through every reader, from the deterministic fixture ---------

SHAPES: dict[str, dict[str, Any]] = {
    "no optimizer": {"num_lr": 0},
    "no watched layer": {"num_lr": 0, "layers": ()},
    "no parameter layer": {"num_lr": 0, "layers": (("act", "ReLU"),)},
    "three LR groups": {"num_lr": 3},
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_reader_takes_zero_width_fields(shape: str, tmp_path: Path) -> None:
    kw = SHAPES[shape]
    src = FixtureSource(1200, grad_every=7, **kw)
    state = RunState(src.meta, tail=256)  # a small tail: scrubbing reads the recorded source
    state.ingest(src.poll())
    assert state.history.rows == 1200
    lr = state.value_at("lr", None)
    assert math.isnan(lr) if kw.get("num_lr", 1) == 0 else lr > 0
    run_dir = write_run(FixtureSource(1200, grad_every=7, **kw), tmp_path / "run")
    run = nnwatch.load_run(run_dir)
    assert run["lr"].shape == (1200, kw.get("num_lr", 1))
    recorded = RecordedSource(run_dir)
    for field in ("lr", "grad_norm", "loss"):  # scrubbing far back: exact rows from the log
        cols = state.columns(field, 40, 100.0, 300.0, recorded)
        assert cols.n == 40
    assert math.isfinite(state.value_at("grad_norm", 150.0, recorded, measured=True))
    assert math.isnan(state.value_at("lr", 150.0, recorded)) == (kw.get("num_lr", 1) == 0)

    async def body(pilot: Pilot[Any], app: NNWatchApp) -> None:
        await settle(pilot, app, 1200)
        await pilot.press("home", "right", "z", "l", "escape", "end")
        await pilot.pause(0.2)
        assert [p.key for p in app.query(Pane) if p.draw_error] == []
        assert not app.state.reader_errors
        assert "FINISHED" in pane_text(app.query_one(RunHeader))
        layers = app.query_one(LayersPane)
        assert layers.shown_rows == list(src.meta.schema.layer_names)
        if not src.meta.schema.layer_names:
            assert "none of this model's modules is watched" in pane_text(layers)

    drive(make_app(recorded), body, size=(80, 24))


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_nnwatch_open_in_a_real_terminal(runs: dict[str, Path], run_root: Path) -> None:
    """The user's command, in a real terminal: the dashboard of the optimizer=None run."""
    import os

    from tests.terminal import Terminal

    env = {
        "NNWATCH_RUN_DIR": str(run_root),
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    cmd = f"{shlex.quote(sys.executable)} -m nnwatch open {shlex.quote(str(runs['lstm']))}"
    term = Terminal(cmd, env, size=(160, 48))
    try:
        screen = term.wait_for("FINISHED", timeout=60)
        assert "CONNECTING" not in screen and "Loss" in screen and "step 149" in screen
        term.keys("q")
        assert term.exit_status() == 0
    finally:
        term.close()
