"""Issue 43, item 14: every test ends every process it starts, and the suite checks it.

``make test`` on a fresh clone left ``python -m nnwatch.testing.synthetic ... --steps 0`` running
an hour later, re-parented to init: a trainer that was pid 1 of its own PID namespace, where
SIGTERM is ignored, started by ``unshare --fork``, which does not take its child down. With
``--kill-child`` it dies with ``unshare``; and ``tests/conftest.py`` makes the suite a child
subreaper, so that anything a test leaves is found (and killed) at the end, failing the run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO

PYTHON = sys.executable
pytestmark = pytest.mark.timeout(180)


def _inner_sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if marker in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("kill_child", [False, True])
def test_pid_1_of_a_namespace_dies_with_unshare_only_with_kill_child(kill_child: bool) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    marker = f"nnw-pid1-{kill_child}-{time.time_ns()}"
    flags = ["--kill-child"] if kill_child else []
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *flags, PYTHON, "-c",
                             f"import time; time.sleep(600)  # {marker}"])  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not _inner_sleepers(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _inner_sleepers(marker):
            pytest.skip("unshare --pid is not allowed here")
        proc.send_signal(signal.SIGTERM)  # what the old clean-up did: SIGTERM, then SIGKILL
        try:
            proc.wait(5)  # unshare passes it on to pid 1, which ignores it
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        deadline = time.monotonic() + 10
        while _inner_sleepers(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _inner_sleepers(marker)
        assert bool(left) is (not kill_child), left  # the leak, reproduced; and its fix
    finally:
        for p in _inner_sleepers(marker):
            p.kill()


LEAKY = """
import subprocess, time

def test_leaves_a_grandchild():
    subprocess.Popen(["sh", "-c", "exec sleep 300 &"])  # orphaned at once: init's, not ours
    time.sleep(1)
"""


def test_the_session_check_names_and_kills_what_a_test_left(tmp_path: Path) -> None:
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(LEAKY))
    done = subprocess.run(
        [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(tmp_path / "test_leaky.py")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("TEXTUAL_SNAPSHOT_")},
    )  # fmt: skip
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "the tests left processes running" in done.stderr, done.stderr
    assert "test_leaky.py::test_leaves_a_grandchild" in done.stderr and "sleep 300" in done.stderr
    time.sleep(0.5)
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "300"]]
