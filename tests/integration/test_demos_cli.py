"""``nnwatch demo`` as a command: listing, mistakes explained in words, ``--keep`` plus the README's
replay command, and cleanup when the command itself is interrupted (Ctrl-C, a closed terminal).

The trainer is always a real subprocess; "nothing left behind" is checked on the real run root and
on the trainer's real pid.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nnwatch.sources.demo_trainer import ORDER
from nnwatch.store.identity import same_process
from nnwatch.store.registry import list_runs

REPO = Path(__file__).resolve().parents[2]


def nnwatch_cmd(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nnwatch", *args],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )  # fmt: skip


def kill_trainers(root: Path) -> None:
    """After a failed test: the trainers registered under this test's private run root."""
    for info in list_runs(root):
        if same_process(info.pid, info.start_time):
            os.kill(info.pid, signal.SIGKILL)


def leftovers(root: Path) -> list[Path]:
    return [p for sub in ("runs", "registry", "s") for p in (root / sub).glob("*")]


def test_list_describes_every_demo(subprocess_env: dict[str, str]) -> None:
    out = nnwatch_cmd(subprocess_env, "demo", "--list")
    assert out.returncode == 0, out.stderr
    starts = [
        line.split()[0] for line in out.stdout.splitlines() if line and not line.startswith(" ")
    ]
    assert starts[: len(ORDER)] == list(ORDER)
    assert "too high" in out.stdout and "log of probabilities" in out.stdout
    assert "What you see" in out.stdout


def test_mistakes_are_explained_and_start_nothing(
    subprocess_env: dict[str, str], run_root: Path
) -> None:
    unknown = nnwatch_cmd(subprocess_env, "demo", "exploded")
    assert unknown.returncode == 2
    assert "no demo called 'exploded'" in unknown.stderr and "exploding" in unknown.stderr
    no_tty = nnwatch_cmd(subprocess_env, "demo", "exploding")  # stdout is a pipe, not a terminal
    assert no_tty.returncode == 1 and "--headless" in no_tty.stderr
    bad_steps = nnwatch_cmd(subprocess_env, "demo", "healthy", "--headless", "--steps", "0")
    assert bad_steps.returncode == 2 and "--steps" in bad_steps.stderr
    for out in (unknown, no_tty, bad_steps):
        assert "Traceback" not in out.stderr
    assert leftovers(run_root) == []


def test_keep_then_replay_finds_the_log(subprocess_env: dict[str, str], run_root: Path) -> None:
    """The README's NaN story: the kept run's automatic snapshot, replayed under anomaly mode."""
    out = nnwatch_cmd(subprocess_env, "demo", "nan_log", "--headless", "--steps", "60", "--keep")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("nan_or_inf step=40 ")
    kept = re.search(r"the run is kept in (\S+)", out.stderr)
    assert kept, out.stderr
    run_dir = Path(kept.group(1))
    assert (run_dir / "snapshots" / "step-40").is_dir()
    hint = re.search(r"nnwatch replay (\S+) --model (\S+) --anomaly", out.stderr)
    assert hint and hint.group(1) == str(run_dir)
    replay = nnwatch_cmd(
        subprocess_env, "replay", str(run_dir), "--model", hint.group(2), "--anomaly"
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "reproduced" in replay.stdout
    origin = re.search(r"first turned finite inputs into NaN/Inf: (\S+) at (\S+)", replay.stdout)
    assert origin and origin.group(1) == "torch.log" and "nan_log.py" in origin.group(2), (
        replay.stdout
    )
    assert "LogBackward0" in replay.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupting_the_command_stops_the_trainer_and_cleans_up(
    sig: signal.Signals, subprocess_env: dict[str, str], run_root: Path
) -> None:
    cmd = [sys.executable, "-m", "nnwatch", "demo", "exploding", "--headless", "--steps", "100000"]
    proc = subprocess.Popen(
        cmd, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    watchdog = threading.Timer(180, proc.kill)  # a missing finding must fail the test, not hang it
    watchdog.start()
    try:
        assert proc.stdout is not None
        seen = [proc.stdout.readline() for _ in range(2)]  # findings stream out while it runs
        assert any(line.startswith("exploding_gradients step=") for line in seen), seen
        runs = list_runs(run_root)
        assert len(runs) == 1 and runs[0].live
        trainer = runs[0]
        assert same_process(trainer.pid, trainer.start_time)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            kill_trainers(run_root)
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig)
    deadline = time.monotonic() + 10
    while same_process(trainer.pid, trainer.start_time) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not same_process(trainer.pid, trainer.start_time), "the trainer outlived the command"
    assert leftovers(run_root) == []


def test_a_demo_that_ends_before_the_first_poll_is_still_found(run_root: Path) -> None:
    # A short headless run can register, train and unregister between two polls of the command
    # (seen in CI: the nan_log demo stops at step 40 in well under a second once warm).
    from nnwatch.sources.demo_trainer import Trainer, find_demos

    demo = find_demos()["healthy"]
    trainer = Trainer(demo, steps=2, delay=0.0, seed=0)
    try:
        assert trainer.proc.wait(timeout=120) == 0, trainer.output_tail()
        assert list_runs(run_root) == []  # its registry entry is gone already
        info = trainer.wait_registered(timeout=5)
        assert info.pid == trainer.proc.pid and (Path(info.run_dir) / "meta.json").is_file()
    finally:
        kept = trainer.finish(keep=False)
    assert kept is None and not Path(info.run_dir).exists()  # and it is cleaned up as usual
