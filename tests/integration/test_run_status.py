"""A run ends with the status its program ended with, recorded by a real training subprocess."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON

LOOP = """
import sys, torch
from torch import nn
import nnwatch
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def train(w, steps, fail_at=None):
    for step in range(steps):
        if step == fail_at:
            FAILURE()
        x = torch.randn(8, 4)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        w.step(loss)
"""

PROGRAMS = {
    # an exception in the user's own code, inside the README's `with` block
    "with_overflow": (
        "def FAILURE():\n    raise OverflowError('math range error in my schedule')\n"
        "with nnwatch.watch(model, opt, name='p') as w:\n    train(w, 30, fail_at=20)\n"
    ),
    # the same with no `with` block: only the exception hook and the exit handler see it
    "bare_overflow": (
        "def FAILURE():\n    raise OverflowError('math range error in my schedule')\n"
        "w = nnwatch.watch(model, opt, name='p')\ntrain(w, 30, fail_at=20)\n"
    ),
    # a framework (Hydra does this) catches the job's exception and exits with status 1
    "framework_exit": (
        "def FAILURE():\n    raise RuntimeError('Connection reset by peer')\n"
        "def run_job():\n"
        "    try:\n        train(w, 30, fail_at=12)\n"
        "    except Exception as exc:\n        print('Error executing job:', exc, file=sys.stderr)\n"
        "        sys.exit(1)\n"
        "w = nnwatch.watch(model, opt, name='p')\nrun_job()\n"
    ),
    "ctrl_c": (
        "def FAILURE():\n    raise KeyboardInterrupt\n"
        "w = nnwatch.watch(model, opt, name='p')\ntrain(w, 30, fail_at=15)\n"
    ),
    "clean_no_close": (
        "def FAILURE():\n    pass\nw = nnwatch.watch(model, opt, name='p')\ntrain(w, 10)\n"
    ),
    "clean_exit_zero": (
        "def FAILURE():\n    pass\nw = nnwatch.watch(model, opt, name='p')\ntrain(w, 10)\nsys.exit(0)\n"
    ),
}


def _run(name: str, env: dict[str, str], tmp_path: Path) -> tuple[int, dict, list[dict]]:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(LOOP) + PROGRAMS[name])
    done = subprocess.run([PYTHON, str(script)], env=env, capture_output=True, text=True, timeout=120)
    runs = list(Path(env["NNWATCH_RUN_DIR"]).glob("runs/p-*"))
    assert len(runs) == 1, done.stderr
    end = json.loads((runs[0] / "end.json").read_text())
    events = [json.loads(line) for line in (runs[0] / "events.jsonl").read_text().splitlines() if line]
    return done.returncode, end, events


@pytest.mark.parametrize("name", ["with_overflow", "bare_overflow"])
def test_uncaught_exception_is_crashed_with_its_type_and_message(
    name: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    code, end, events = _run(name, subprocess_env, tmp_path)
    assert code == 1
    assert end["status"] == "crashed"
    assert end["exception"] == {"type": "OverflowError", "message": "math range error in my schedule"}
    assert end["steps"] == 20
    ended = [e for e in events if e.get("type") == "run_ended"]
    assert ended and ended[0]["status"] == "crashed" and "OverflowError" in ended[0]["reason"]


def test_a_framework_exit_status_of_1_is_crashed(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    code, end, _ = _run("framework_exit", subprocess_env, tmp_path)
    assert code == 1
    assert end["status"] == "crashed" and end["exit_code"] == 1
    assert "status 1" in end["reason"]


def test_ctrl_c_is_interrupted(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    code, end, _ = _run("ctrl_c", subprocess_env, tmp_path)
    assert code != 0
    assert end["status"] == "interrupted" and end["steps"] == 15


@pytest.mark.parametrize("name", ["clean_no_close", "clean_exit_zero"])
def test_a_clean_end_is_finished(name: str, subprocess_env: dict[str, str], tmp_path: Path) -> None:
    code, end, events = _run(name, subprocess_env, tmp_path)
    assert code == 0
    assert end["status"] == "finished" and end["steps"] == 10
    assert not [e for e in events if e.get("type") == "run_ended"]
    # what nnwatch's own work cost the run, as the probe timed it: a share, never 0 or NaN
    assert 0 < end["nnwatch_own_share"] < 1


def test_real_sigint_is_interrupted(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    """Ctrl-C as a terminal sends it: SIGINT to a loop that is training."""
    script = tmp_path / "sigint.py"
    script.write_text(
        textwrap.dedent(LOOP)
        + "def FAILURE():\n    pass\n"
        + "w = nnwatch.watch(model, opt, name='p')\nprint('ready', flush=True)\ntrain(w, 10**9)\n"
    )
    proc = subprocess.Popen(
        [PYTHON, str(script)], env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    run = next(iter(Path(subprocess_env["NNWATCH_RUN_DIR"]).glob("runs/p-*")))
    deadline = time.monotonic() + 30
    while not (run / "meta.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    end = json.loads((run / "end.json").read_text())
    assert end["status"] == "interrupted"


def test_a_ctrl_c_that_lands_while_the_channel_starts_still_stops_the_loop(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """Ctrl-C during the first step's set-up, while the command server's thread starts (where one
    landed in a full test run: 1 run in 30 there). The set-up's clean-up then joined a thread that
    never ran, and its RuntimeError replaced the KeyboardInterrupt: nnwatch took it for a broken
    channel ("live monitoring is off") and the loop trained on, deaf to the Ctrl-C. The interrupt
    is raised where the signal landed, in ``Thread.start`` before the thread ran."""
    script = tmp_path / "ctrl_c_at_setup.py"
    script.write_text(
        textwrap.dedent(LOOP)
        + textwrap.dedent("""
            import threading
            _start = threading.Thread.start
            def start(self):
                if self.name == "nnwatch-commands":
                    raise KeyboardInterrupt
                _start(self)
            threading.Thread.start = start
            w = nnwatch.watch(model, opt, name='p')
            train(w, 10**9)
        """)
    )
    proc = subprocess.run(
        [PYTHON, str(script)], env=subprocess_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0, proc.stderr
    assert "KeyboardInterrupt" in proc.stderr
    assert "live monitoring is off" not in proc.stderr
    run = next(iter(Path(subprocess_env["NNWATCH_RUN_DIR"]).glob("runs/p-*")))
    end = run / "end.json"
    if end.exists():  # the run log started before the channel: it says how the run ended
        assert json.loads(end.read_text())["status"] == "interrupted"
