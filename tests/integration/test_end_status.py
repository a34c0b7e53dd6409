"""One status everywhere (issue 33, item 9): ``end.json``, ``nnwatch ls --all`` and ``load_run``
agree on how a run ended, for Ctrl-C, a damaged ``end.json``, SIGTERM and SIGKILL, each
recorded by a real training subprocess."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from nnwatch.store.run_reader import load_run
from tests.conftest import PYTHON
from tests.integration.test_run_status import LOOP

FOREVER = "def FAILURE():\n    pass\n"


def _ls_all(env: dict[str, str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [PYTHON, "-m", "nnwatch", "ls", "--all", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def _ls_text(env: dict[str, str]) -> str:
    done = subprocess.run(
        [PYTHON, "-m", "nnwatch", "ls", "--all"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _run_to_end(program: str, env: dict[str, str], tmp_path: Path) -> tuple[int, Path]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(LOOP) + program)
    done = subprocess.run([PYTHON, str(script)], env=env, capture_output=True, text=True, timeout=120)
    (tmp_path / "prog.out").write_text(done.stdout)
    runs = list(Path(env["NNWATCH_RUN_DIR"]).glob("runs/p-*"))
    assert len(runs) == 1, done.stderr
    return done.returncode, runs[0]


def _start(program: str, env: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """A training loop that runs until a signal ends it; returns once it made 5 steps."""
    script = tmp_path / "forever.py"
    script.write_text(textwrap.dedent(LOOP) + program)
    proc = subprocess.Popen(
        [PYTHON, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = list(Path(env["NNWATCH_RUN_DIR"]).glob("runs/p-*"))
        if runs and (runs[0] / "scalars.bin").exists() and (runs[0] / "scalars.bin").stat().st_size > 64 + 5 * 64:
            return proc, runs[0]
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the trainer made no steps")


def test_ctrl_c_reads_interrupted_in_end_json_ls_and_load_run(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    program = FOREVER.replace("pass", "raise KeyboardInterrupt") + (
        "w = nnwatch.watch(model, opt, name='p')\ntrain(w, 30, fail_at=15)\n"
    )
    _, run = _run_to_end(program, subprocess_env, tmp_path)
    assert json.loads((run / "end.json").read_text())["status"] == "interrupted"
    (row,) = _ls_all(subprocess_env)
    assert row.get("status", row["state"]) == "interrupted" and row["ended"]
    assert "interrupted" in _ls_text(subprocess_env).splitlines()[1]
    assert load_run(run).status == "interrupted"


@pytest.mark.parametrize("damage", ["", '{"status": "fini', "[1, 2]", "\x00" * 40])
@pytest.mark.parametrize("how", ["finished", "crashed"])
def test_a_damaged_end_json_gives_ls_and_load_run_one_answer(
    damage: str, how: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """Empty, cut short, not an object, NULs (a full disk): the run reached its close, so it
    ended; how is taken from its ``run_ended`` event (none for a clean end)."""
    fail = "raise OverflowError('boom')" if how == "crashed" else "pass"
    program = f"def FAILURE():\n    {fail}\nw = nnwatch.watch(model, opt, name='p')\ntrain(w, 12, fail_at=8)\n"
    _, run = _run_to_end(program, subprocess_env, tmp_path)
    (run / "end.json").write_text(damage)
    (row,) = _ls_all(subprocess_env)
    loaded = load_run(run)
    assert row.get("status", row["state"]) == loaded.status == how, (row.get("status", row["state"]), loaded.status, row["message"])
    assert "end.json" in row["message"]
    assert any("end.json" in w for w in loaded.warnings)


def test_sigterm_is_told_apart_from_sigkill_and_the_signal_still_ends_the_program(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    program = FOREVER + "w = nnwatch.watch(model, opt, name='p')\ntrain(w, 10**9)\n"
    proc, run = _start(program, subprocess_env, tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # still killed by SIGTERM, as without nnwatch
    end = json.loads((run / "end.json").read_text())
    assert end["status"] == "interrupted" and end["signal"] == "SIGTERM", end
    (row,) = _ls_all(subprocess_env)
    assert row.get("status", row["state"]) == "interrupted" and "SIGTERM" in row["message"]
    assert load_run(run).status == "interrupted"

    for old in Path(subprocess_env["NNWATCH_RUN_DIR"]).glob("runs/p-*"):
        old.rename(old.with_name("x" + old.name))
    proc, run = _start(program, subprocess_env, tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (run / "end.json").exists()
    killed = next(r for r in _ls_all(subprocess_env) if r["run_dir"] == str(run))
    assert killed.get("status", killed["state"]) == "crashed" and "SIGKILL" in killed["message"]
    assert "SIGTERM" not in killed["message"]


def test_sigterm_while_the_main_thread_is_blocked_in_c_ends_it_at_once(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """A Python handler runs only between bytecodes; a thread woken by the signal does not wait
    for a C call (here a pbkdf2 of minutes) to return."""
    program = FOREVER + (
        "import hashlib\nw = nnwatch.watch(model, opt, name='p')\ntrain(w, 20)\n"
        "print('blocking', flush=True)\nhashlib.pbkdf2_hmac('sha256', b'x', b'y', 2 * 10**9)\n"
    )
    proc, run = _start(program, subprocess_env, tmp_path)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "blocking"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)  # the pbkdf2 alone would take far longer
    assert proc.returncode == -signal.SIGTERM
    end = json.loads((run / "end.json").read_text())
    assert end["status"] == "interrupted" and end["signal"] == "SIGTERM" and end["steps"] == 20


def test_the_programs_own_sigterm_handler_still_decides(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    program = FOREVER + (
        "import signal\n"
        "def mine(signum, frame):\n    print('saved a checkpoint', flush=True)\n    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        "w = nnwatch.watch(model, opt, name='p')\ntrain(w, 10**9)\n"
    )
    proc, run = _start(program, subprocess_env, tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "saved a checkpoint" in out
    end = json.loads((run / "end.json").read_text())
    assert end["status"] == "interrupted" and end["signal"] == "SIGTERM", end


def test_an_ignored_sigterm_stays_ignored(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    program = FOREVER + (
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "w = nnwatch.watch(model, opt, name='p')\ntrain(w, 10**9)\n"
    )
    proc, run = _start(program, subprocess_env, tmp_path)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None, "an ignored SIGTERM ended the program"
    proc.kill()
    proc.communicate(timeout=60)


def test_a_sigterm_to_a_forked_worker_ends_the_worker_only(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """A DataLoader worker is a fork of the trainer: SIGTERM ends it as before, and neither
    closes the trainer's run nor reaches the trainer through the inherited wakeup pipe."""
    program = FOREVER + (
        "import os, signal, time\nw = nnwatch.watch(model, opt, name='p')\ntrain(w, 5)\n"
        "child = os.fork()\n"
        "if child == 0:\n    time.sleep(60)\n    os._exit(0)\n"
        "time.sleep(0.5)\nos.kill(child, signal.SIGTERM)\n"
        "_, status = os.waitpid(child, 0)\n"
        "print('worker', os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1, flush=True)\n"
        "time.sleep(0.5)\ntrain(w, 5)\nw.close()\nprint('trainer went on', flush=True)\n"
    )
    code, run = _run_to_end(program, subprocess_env, tmp_path)
    out = (tmp_path / "prog.out").read_text()
    assert code == 0 and "worker 15" in out and "trainer went on" in out, out
    end = json.loads((run / "end.json").read_text())
    assert end["status"] == "finished" and "signal" not in end and end["steps"] == 10, end


def test_ctrl_c_reads_interrupted_in_open_and_attach_too(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """The dashboard's badge for a Ctrl-C run, from its log (``open``) and as a live source
    finds it ended (``attach``): INTERRUPTED, as ``end.json`` says."""
    import asyncio

    from nnwatch.sources.live import LiveSource
    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.testing.tui import fixed_hardware
    from nnwatch.tui.app import NNWatchApp
    from nnwatch.tui.widgets.header import RunHeader

    program = FOREVER.replace("pass", "raise KeyboardInterrupt") + (
        "w = nnwatch.watch(model, opt, name='p')\ntrain(w, 30, fail_at=15)\n"
    )
    _, run = _run_to_end(program, subprocess_env, tmp_path)
    live = LiveSource(run)
    try:
        assert live.poll().status.state == "interrupted"
    finally:
        live.close()
    app = NNWatchApp(RecordedSource(run), hardware=fixed_hardware, fps=10)
    seen: dict[str, str] = {}

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            for _ in range(50):
                await pilot.pause(0.1)
                seen["text"] = app.query_one(RunHeader)._picture.plain
                if "INTERRUPTED" in seen["text"]:
                    break

    asyncio.run(main())
    assert "INTERRUPTED" in seen["text"], seen["text"]
