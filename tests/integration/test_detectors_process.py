"""The detectors in a process of their own (issue 35): a fast loop hands them over with their state,
they find what they would have found in the thread, and the process never outlives the run.

Real loops, a real ring, a real child process; the trainer is killed for real.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.probe.watch import internals
from tests.conftest import REPO


@pytest.fixture
def run_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "runs"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(d))
    torch.set_num_threads(1)
    return d


def _tiny() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    return m, torch.optim.SGD(m.parameters(), lr=1e-3)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_fast_loop_hands_its_detectors_over_and_they_find_the_nan_at_its_step(run_root: Path) -> None:
    """Left to choose (``auto``), a 0.2 ms step moves the detectors out once they have cost more
    than half the budget; a NaN injected after the move is found at its step, with its origin,
    and the finding reaches ``w.findings`` and events.jsonl before ``close`` returns."""
    m, opt = _tiny()
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    with nnwatch.watch(m, opt, name="fast") as w:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            opt.zero_grad()
            loss = nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            w.step(loss)
            if internals(w).files.diagnosis.link is not None:
                break
        link = internals(w).files.diagnosis.link
        assert link is not None, "a 0.2 ms step's detectors stayed in the training process"
        bad = w.step_index + 150
        for _ in range(300):
            step = w.step_index
            opt.zero_grad()
            loss = nn.functional.mse_loss(m(x * math.nan if step == bad else x), y)
            loss.backward()
            opt.step()
            w.step(loss)
            if step == bad:
                break
    assert link.proc.poll() is not None  # ended with the watch
    assert link.done is not None and link.done["rows"] > 0 and link.done["dropped"] == 0
    nan = [f for f in w.findings if f.kind == "nan_or_inf"]
    assert nan and nan[0].step == bad, [(f.kind, f.step) for f in w.findings]
    assert "0 (Linear)" in nan[0].summary  # the first layer's output went bad: the origin
    logged = [e for e in nnwatch.load_run(w.run_dir).events if e.get("type") == "finding"]
    assert any(e["kind"] == "nan_or_inf" and e["step"] == bad for e in logged)


def test_without_a_ring_the_detectors_stay_in_the_thread(
    run_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NNWATCH_DETECTORS", "process")
    m, opt = _tiny()
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    with nnwatch.watch(m, opt, name="noring", channel=False) as w:
        for step in range(400):
            opt.zero_grad()
            loss = nn.functional.mse_loss(m(x * math.inf if step == 300 else x), y)
            loss.backward()
            opt.step()
            w.step(loss)
            if step == 300:
                break
            time.sleep(0.002 if step < 200 else 0)  # past the writer's first drains
    assert internals(w).files.diagnosis.link is None
    assert [f.step for f in w.findings if f.kind == "nan_or_inf"] == [300]


_TRAINER = """
import os, sys, time, torch
from torch import nn
import nnwatch
from nnwatch.probe.watch import internals
torch.set_num_threads(1)
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(m.parameters(), lr=1e-3)
x, y = torch.randn(32, 16), torch.randn(32, 1)
mode = sys.argv[1]
with nnwatch.watch(m, opt, name="kill") as w:
    told = False
    for step in range(10**9):
        opt.zero_grad(); loss = nn.functional.mse_loss(m(x), y); loss.backward(); opt.step()
        w.step(loss)
        time.sleep(0.001)
        link = internals(w).files.diagnosis.link
        if link is not None and not told:
            told = True
            print("judge", link.pid, flush=True)
            if mode == "kill-judge":
                os.kill(link.pid, 9)
                stop_at = step + 300
        if mode == "kill-judge" and told and step >= stop_at:
            break
print("finished", w.step_index, flush=True)
"""


def _trainer(mode: str, run_root: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "NNWATCH_RUN_DIR": str(run_root), "NNWATCH_DETECTORS": "process",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-c", _TRAINER, mode], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _judge_pid(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("judge "), line + (proc.stderr.read() if proc.stderr else "")
    return int(line.split()[1])


def test_a_trainer_killed_takes_its_detectors_process_with_it(run_root: Path) -> None:
    proc = _trainer("run", run_root)
    try:
        judge = _judge_pid(proc)
        assert not _gone(judge)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while not _gone(judge) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(judge), "the detectors' process outlived its trainer"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_detectors_process_killed_leaves_training_going_and_says_so(run_root: Path) -> None:
    proc = _trainer("kill-judge", run_root)
    try:
        _judge_pid(proc)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "finished" in out
    assert "the detectors' process ended" in err and "findings stop here" in err
    assert "Traceback" not in err

