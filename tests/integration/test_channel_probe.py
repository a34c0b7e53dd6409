"""The channel with a real training loop: ``nnwatch.watch`` on a torch MLP in a subprocess
(tests/trainers/mlp_trainer.py), followed, steered and killed by a monitor in this process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nnwatch.cli import main as cli_main
from nnwatch.sources.live import ConnectedSource, LiveSource
from nnwatch.store.registry import RunInfo, list_runs
from nnwatch.store.run_reader import load_run
from tests.integration.test_channel_faults import poll_until, steps_of, wait_for

pytest.importorskip("torch")


class MLPRun:
    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.trainers.mlp_trainer", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if not first.startswith("run_dir "):
            raise AssertionError(f"trainer did not start: {first!r} {self.proc.stderr.read()}")
        self.run_dir = Path(first.split(" ", 1)[1].strip())
        # the channel opens at the first w.step(): wait for the registry entry
        self.info: RunInfo = wait_for(self._entry, timeout=30)

    def _entry(self) -> RunInfo | None:
        for r in list_runs():
            if r.pid == self.proc.pid and r.socket:
                return r
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


@pytest.fixture
def mlp(subprocess_env: dict[str, str]) -> Iterator[Callable[..., MLPRun]]:
    runs: list[MLPRun] = []

    def start(*args: str) -> MLPRun:
        run = MLPRun(subprocess_env, *args)
        runs.append(run)
        return run

    yield start
    for r in runs:
        r.stop()


def test_monitor_follows_and_steers_a_real_training_loop(mlp: Callable[..., MLPRun]) -> None:
    run = mlp("--steps", "100000", "--delay", "0.002", "--name", "steered")
    source = LiveSource.from_info(run.info)
    assert source.meta.schema.num_layers >= 2 and source.can_command
    updates = poll_until(source, lambda u, all_: len(steps_of(all_)) > 20)
    assert sum(len(u.layers) for u in updates) > 0  # sampled per-layer rows arrive too

    reply = source.command("set_clip", max_norm=0.5)
    assert reply.ok and reply.applies_at_step is not None
    updates += poll_until(
        source, lambda u, _: len(u.scalars) and (u.scalars["clip_threshold"] == 0.5).any()
    )
    snap = source.command("snapshot", reason="from the test")
    assert snap.ok
    updates += poll_until(
        source, lambda u, all_: any(e.get("type") == "snapshot" for x in all_ for e in x.events)
    )
    assert source.command("set_layer_interval", n=2).ok
    assert source.command("anomaly", steps=2).ok

    assert source.command("pause").ok
    updates += poll_until(source, lambda u, _: u.status.state == "paused")
    held = steps_of(updates)[-1]
    time.sleep(0.3)
    assert steps_of([source.poll()]) in ([], [held + 1])  # the loop is held at a step boundary
    assert source.command("resume").ok
    updates += poll_until(source, lambda u, _: u.status.state == "live" and len(u.scalars))

    assert source.command("stop").ok  # sets w.should_stop; the loop ends itself
    updates += poll_until(source, lambda u, _: u.status.state == "finished", timeout=30)
    assert run.proc.wait(timeout=30) == 0
    steps = steps_of(updates)
    assert steps == list(range(len(steps)))
    commands = [e for u in updates for e in u.events if e.get("type") == "command"]
    names = [e.get("command", e.get("name")) for e in commands]
    for name in (
        "set_clip",
        "snapshot",
        "set_layer_interval",
        "anomaly",
        "pause",
        "resume",
        "stop",
    ):
        assert name in names
    log = load_run(run.run_dir)
    assert log.status == "finished" and len(log.scalars) == len(steps)
    source.close()


def test_killed_training_process_is_reported_crashed(mlp: Callable[..., MLPRun]) -> None:
    run = mlp("--steps", "100000", "--delay", "0.002", "--name", "doomed")
    local = LiveSource.from_info(run.info)
    remote = ConnectedSource(run.info.socket)
    poll_until(local, lambda u, all_: len(steps_of(all_)) > 10)
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait()
    poll_until(local, lambda u, _: u.status.state == "crashed", timeout=2.0)
    poll_until(remote, lambda u, _: u.status.state == "crashed", timeout=5.0)
    log = load_run(run.run_dir)
    assert log.status == "crashed" and len(log.scalars) > 10
    local.close()
    remote.close()


def test_ls_and_ctl_against_a_real_run(
    mlp: Callable[..., MLPRun], capsys: pytest.CaptureFixture[str]
) -> None:
    run = mlp("--steps", "100000", "--delay", "0.005", "--name", "ctl-target")
    assert cli_main(["ls", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "ctl-target" and row["live"] and row["pid"] == run.proc.pid
    name = Path(run.info.run_dir).name
    assert cli_main(["ctl", name, "set_clip", "2.5"]) == 0
    assert "set_clip applies at step" in capsys.readouterr().out
    assert cli_main(["ctl", name, "set_clip", "-1"]) == 2
    assert "finite number" in capsys.readouterr().err
    assert cli_main(["ctl", name, "fly"]) == 2
    assert cli_main(["ctl", name, "pause", "--for", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "pause applies at step" in out and "resumed" in out
    assert cli_main(["ctl", str(run.proc.pid), "stop", "--json"]) == 0
    (reply,) = json.loads(capsys.readouterr().out)
    assert reply["ok"] and isinstance(reply["applies_at_step"], int)
    assert run.proc.wait(timeout=30) == 0
    assert cli_main(["ctl", name, "stop"]) == 1  # finished and unregistered: nothing to steer
